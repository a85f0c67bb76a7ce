"""feedfast.baseline.timing: one round of a loader, as ``feedfast bench --compare`` and ``make bench`` time it."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from feedfast.baseline.measure import RunPlan
from feedfast.baseline.rounds import round_order
from feedfast.baseline.timing import samples_per_cpu_s, time_round

ROOT = Path(__file__).resolve().parents[1]


class Fake:
    """A loader of 4-row batches that delivers ``valid`` rows of each (the rest is padding)."""

    def __init__(self, name: str, events: list[str], *, valid: int | None = 3, fail_at: int | None = None) -> None:
        self.name, self.events, self.fail_at = name, events, fail_at
        self.taken = self.done = 0
        self.valid = valid
        self.closed = False
        if valid is None:
            self.delivered = None  # type: ignore[assignment]  # no count of its own: its rows count
        events.append(f"build {name}")

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        assert not self.closed, "a closed loader was asked for a batch"
        self.taken += 1
        if self.taken == self.fail_at:
            raise RuntimeError("bad sample")
        self.done += 4 if self.valid is None else self.valid
        self.events.append(f"batch {self.name}")
        return torch.zeros(4, 2), torch.zeros(4)

    def delivered(self) -> int:
        return self.done

    def close(self) -> None:
        self.closed = True
        self.events.append(f"close {self.name}")


PLAN = RunPlan(warmup=2, count=5, gpu=False)


def test_a_round_builds_warms_up_times_and_closes() -> None:
    events: list[str] = []
    built: list[Fake] = []

    def make() -> Fake:
        time.sleep(0.02)  # construction counts in the time to first batch
        built.append(Fake("a", events))
        return built[-1]

    figs, meter = time_round(make, PLAN)
    assert events == ["build a", *["batch a"] * 7, "close a"] and built[0].closed
    # 2 warm-up batches untimed, 5 timed: 3 delivered samples each, the padding row left out
    assert figs["batches"] == 5 and figs["samples"] == 15
    assert figs["samples_per_s"] == pytest.approx(15 / figs["wall_s"])
    assert figs["time_to_first_batch_s"] >= 0.02 and figs["cpu_s"] >= 0
    assert meter.summary()["steps"] >= 4


def test_a_round_counts_rows_without_a_delivered_count() -> None:
    figs, _ = time_round(lambda: Fake("a", [], valid=None), PLAN)
    assert figs["samples"] == 5 * 4


def test_a_round_closes_its_loader_when_a_batch_fails() -> None:
    events: list[str] = []
    with pytest.raises(RuntimeError, match="bad sample"):
        time_round(lambda: Fake("a", events, fail_at=4), PLAN)
    assert events[-1] == "close a"


def test_alternating_rounds_each_build_a_new_loader_closed_before_the_next() -> None:
    events: list[str] = []
    built: list[Fake] = []

    def make(name: str) -> Fake:
        built.append(Fake(name, events))
        return built[-1]

    rates: dict[str, list[float]] = {"feedfast": [], "torch": []}
    for order in round_order(["feedfast", "torch"], 3):
        for name in order:
            figs, _ = time_round(lambda: make(name), RunPlan(warmup=1, count=2, gpu=False))  # noqa: B023
            rates[name].append(figs["samples_per_s"])
    one = ["build {0}", "batch {0}", "batch {0}", "batch {0}", "close {0}"]
    names = ["feedfast", "torch", "torch", "feedfast", "feedfast", "torch"]
    assert events == [e.format(name) for name in names for e in one]
    assert len(built) == 6 and all(f.closed and f.taken == 3 for f in built)
    assert all(len(r) == 3 for r in rates.values())


def test_samples_per_cpu_s() -> None:
    assert samples_per_cpu_s({"samples": 100, "cpu_s": 0.5}) == 200.0
    assert samples_per_cpu_s({"samples": 100, "cpu_s": 0.0}) is None


def test_a_feedfast_round_counts_delivered_samples_and_closes_the_loader(shards: list[str]) -> None:
    import feedfast
    from feedfast.baseline.contenders import feedfast_contender

    closed: list[Any] = []

    def make() -> Any:
        loader = feedfast.DataLoader(ROOT / "pipelines/imagenet-train.yaml", shards=shards, batch_size=4,
                                     num_workers=1, backend="threads", last_batch="pad",
                                     overrides=["pipeline.image[1].size=32"])
        return feedfast_contender(loader, closed=closed.append)

    # 23 samples: 6 batches an epoch, the last padded by 1; warm-up 1, then batches 2 to 6 of the first epoch
    figs, _ = time_round(make, RunPlan(warmup=1, count=5, gpu=False))
    assert figs["batches"] == 5 and figs["samples"] == 4 * 4 + 3
    (loader,) = closed
    assert loader.stats()["padded"] == 1 and loader.stats()["delivered"] == 23
    assert loader._backend.ahead is None  # closing dropped the next epoch it had started ahead


def _rows_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_rows", ROOT / "benchmarks" / "rows.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_bench_times_its_rows_with_the_same_round(monkeypatch: pytest.MonkeyPatch) -> None:
    import feedfast.baseline.timing as timing

    rows = _rows_module()
    plans: list[RunPlan] = []
    real = timing.time_round

    def recording(make: Any, plan: RunPlan) -> Any:
        plans.append(plan)
        return real(make, plan)

    monkeypatch.setattr(timing, "time_round", recording)
    events: list[str] = []
    rate, cpu_ms = rows.time_row_cpu(lambda: Fake("row", events), warmup=3, batches=4)
    assert [(p.warmup, p.count) for p in plans] == [(3, 4)]
    assert events == ["build row", *["batch row"] * 7, "close row"] and rate > 0 and cpu_ms >= 0
