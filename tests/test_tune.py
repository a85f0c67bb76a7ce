"""Autotune: the search, its cost model, live settings, and data that do not change under tuning."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import feedfast
from feedfast import _env
from feedfast.compile.build import build_plan
from feedfast.errors import SpecError
from feedfast.loader import autotune as tune
from feedfast.loader.autotune import CostModel, Figures, Observation, Tuner, budget_batches
from feedfast.loader.backends.cpu.threads import run_thread_epoch
from feedfast.loader.knobs import Knobs
from feedfast.order.deal import plan_epoch
from feedfast.sources.dataset import open_shards
from feedfast.spec import load_spec
from tests.helpers import SMALL_SPEC, make_shards


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """48 small JPEG samples in 4 shards: 24 batches of 2, room for a search and a few batches after it."""
    return make_shards(tmp_path_factory.mktemp("tune"), samples=48, per_shard=12, seed=5)


def _spec(**extra: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["batch"] = {"size": 2}
    spec.update(extra)
    return spec


def _epoch(loader: feedfast.DataLoader, step_s: float = 0.0) -> list[tuple[torch.Tensor, list[tuple[str, str]]]]:
    out = []
    for x, _ in loader:
        out.append((x.clone(), list(loader.last_origins)))
        time.sleep(step_s)
    return out


def _same(a: list[tuple[torch.Tensor, list[tuple[str, str]]]], b: list[tuple[torch.Tensor, list[tuple[str, str]]]]) -> None:
    assert [k for _, k in a] == [k for _, k in b]
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b))


def _obs(period_ms: float, wait_ms: float, *, loop_cpu_ms: float = 0.0, runqueue_ms: float = 0.0,
         process_cpu_ms: float = 0.0, loader_cpu_ms: float | None = None) -> Observation:
    return Observation(period=period_ms / 1e3, step=(period_ms - wait_ms) / 1e3, wait=wait_ms / 1e3,
                       loop_cpu=loop_cpu_ms / 1e3, runqueue=runqueue_ms / 1e3, process_cpu=process_cpu_ms / 1e3,
                       loader_cpu=None if loader_cpu_ms is None else loader_cpu_ms / 1e3)


# -- the cost model and the search, on measurements given to them ---------------------------------------


def test_model_predicts_more_threads_help_a_loader_bound_loop_up_to_the_cores() -> None:
    # 1 thread of 4 cores, the loop waits 90 of 100 ms; the loader burns 95 ms of CPU per batch
    model = CostModel(Knobs(1, 2), Figures.of([_obs(100, 90, loop_cpu_ms=5, process_cpu_ms=100)] * 3), cores=4)
    assert model.loader_bound
    assert model.predict(2, 2) == pytest.approx(0.050, rel=0.01)
    assert model.predict(4, 2) < model.predict(3, 2) < model.predict(2, 2)
    assert model.predict(8, 2) == model.predict(4, 2)  # no more cores to run them


def test_the_loader_cpu_is_per_batch_it_made_while_it_fills_its_queue() -> None:
    filling = Observation(period=0.1, step=0.1, wait=0.0, loop_cpu=0.05, runqueue=0.0, process_cpu=0.35,
                          loader_cpu=0.3, made=3)  # three batches made in one period
    assert filling.loader == pytest.approx(0.1) and filling.step_cpu == pytest.approx(0.05)


def test_the_step_cpu_counts_its_math_threads_where_the_loader_counts_its_own() -> None:
    # 100 ms period: the loop thread used 10 ms, torch's math threads 50 ms, the loader's pool 60 ms
    counted = _obs(100, 0, loop_cpu_ms=10, process_cpu_ms=120, loader_cpu_ms=60)
    assert counted.loader == pytest.approx(0.060) and counted.step_cpu == pytest.approx(0.060)
    uncounted = _obs(100, 0, loop_cpu_ms=10, process_cpu_ms=120)  # a backend without a counting pool
    assert uncounted.loader == pytest.approx(0.110) and uncounted.step_cpu == pytest.approx(0.010)
    # on 2 cores the step takes 0.6 of one: the loader's threads have 1.4 cores, not 2
    model = CostModel(Knobs(2, 2), Figures.of([_obs(100, 50, loop_cpu_ms=10, process_cpu_ms=180,
                                                    loader_cpu_ms=120)] * 3), cores=2)
    assert model.cpu_bound and model.predict(3, 2) == model.predict(2, 2)


def test_model_predicts_fewer_threads_help_a_step_that_waits_for_cores() -> None:
    # the loop never waits for data but its step waited 30 ms for a core among 2 loader threads on 2 cores;
    # the loader needs 40 ms of CPU per 100 ms batch, which one thread still delivers in time
    model = CostModel(Knobs(2, 2), Figures.of([_obs(100, 0, loop_cpu_ms=60, runqueue_ms=30, process_cpu_ms=100)] * 3),
                      cores=2)
    assert not model.loader_bound
    assert model.predict(1, 2) == pytest.approx(0.085, rel=0.01)  # 100 - 30 + 30 * 1/2
    assert model.predict(2, 2) == pytest.approx(0.100, rel=0.01)


def test_model_predicts_more_batches_ahead_absorb_jitter_only() -> None:
    jitter = CostModel(Knobs(2, 2), Figures.of([_obs(100, 10, loop_cpu_ms=5, process_cpu_ms=35)] * 3), cores=4)
    assert not jitter.cpu_bound  # the loader keeps up on average (15 ms of work a batch), yet was waited for
    assert jitter.predict(2, 2) == pytest.approx(0.100) and jitter.predict(2, 4) == pytest.approx(0.095)
    bound = CostModel(Knobs(2, 2), Figures.of([_obs(100, 80, loop_cpu_ms=5, process_cpu_ms=200)] * 3), cores=2)
    assert bound.predict(2, 4) == bound.predict(2, 2)  # a loader that cannot keep up gains nothing from a deeper queue


def _search(knobs: Knobs, measured: dict[tuple[int, int], Observation], budget: int = 20, cores: int = 4) -> Tuner:
    tuner = Tuner(knobs, cores=cores, budget=budget)
    tuner.feed(None)  # the first batch: nothing before it to measure
    while not tuner.done:
        tuner.feed(measured[(knobs.threads, knobs.prefetch)])
    return tuner


def test_search_moves_to_the_measured_best_and_explains_it() -> None:
    knobs = Knobs(1, 2, max_threads=4, max_prefetch=4)
    # a loader that needs 100 ms of CPU per batch, on 4 cores: the period is 100 ms / threads
    measured = {(n, p): _obs(100 / n, 100 / n - 5, loop_cpu_ms=2, process_cpu_ms=102) for n in range(1, 5) for p in (2, 4)}
    tuner = _search(knobs, measured)
    report = tuner.report()
    assert report["state"] == "done" and (knobs.threads, knobs.prefetch) == (4, 2)
    assert report["decision"] == {"threads": 4, "prefetch": 2}
    assert [(t["threads"], t["prefetch"]) for t in report["trials"]][0] == (1, 2)
    assert all(t["predicted_ms"] is not None for t in report["trials"][1:])
    assert "chosen" in report["reason"] and report["model"]["cpu_bound"] is True  # fitted on the best, 4 threads
    assert report["model"]["period"] == pytest.approx(25.0)


def test_search_keeps_the_default_when_a_trial_does_not_measure_better() -> None:
    knobs = Knobs(1, 2, max_threads=2, max_prefetch=4)
    # the model predicts 2 threads twice as fast, but the machine gives nothing more (the cores are taken)
    measured = {(n, p): _obs(100, 95, loop_cpu_ms=2, process_cpu_ms=90) for n in (1, 2) for p in (2, 4)}
    tuner = _search(knobs, measured)
    assert (knobs.threads, knobs.prefetch) == (1, 2)
    assert "kept" in tuner.reason
    assert len(tuner.report()["trials"]) >= 2  # it tried, measured, and went back


def test_search_stops_at_once_when_nothing_is_predicted_faster() -> None:
    knobs = Knobs(2, 2, max_threads=3, max_prefetch=4)
    hidden = {(n, p): _obs(150, 0, loop_cpu_ms=1, process_cpu_ms=40) for n in (1, 2, 3) for p in (2, 4)}
    tuner = _search(knobs, hidden)
    assert tuner.seen == 1 + tune.MEASURE and (knobs.threads, knobs.prefetch) == (2, 2)
    assert "predicted" in tuner.reason


def test_search_respects_its_budget() -> None:
    knobs = Knobs(1, 2, max_threads=4, max_prefetch=4)
    measured = {(n, p): _obs(100 / n, 100 / n - 5, loop_cpu_ms=2, process_cpu_ms=102) for n in range(1, 5) for p in (2, 4)}
    tuner = _search(knobs, measured, budget=tune.MIN_BUDGET)
    assert tuner.seen <= tune.MIN_BUDGET and len(tuner.report()["trials"]) == 2
    assert budget_batches(0.1, 79) == tune.MIN_BUDGET and budget_batches(0.1, 1000) == 100


# -- live settings do not change the data -----------------------------------------------------------------


def test_threads_and_batches_ahead_changed_mid_epoch_give_the_same_batches(many: list[str]) -> None:
    spec = load_spec(_spec(shuffle={"buffer": 64, "shards": True}))
    sset = open_shards(many, spec, _env.cache_dir())
    ep = plan_epoch(list(sset.sizes), batch_size=2, rank=0, world=1, last_batch="partial", seed=spec.seed, epoch=1,
                    shuffle_shards=True, partition="global")
    plan = build_plan(spec, device="cpu", consumer="cpu")
    kw: dict[str, Any] = dict(rank=0, world=1, batch_size=2, workers=2, seed=spec.seed, epoch=1)
    want = [(b.fields["image"].clone(), b.origins) for b in run_thread_epoch(plan, sset, ep, **kw)]
    knobs = Knobs(2, 2, max_threads=4, max_prefetch=5)
    got = []
    settings = [(1, 1), (4, 5), (3, 2), (1, 4), (2, 1)]
    for i, b in enumerate(run_thread_epoch(plan, sset, ep, knobs=knobs, **kw)):
        got.append((b.fields["image"].clone(), b.origins))
        knobs.set(*settings[i % len(settings)])
    _same(want, got)
    assert knobs.counted and knobs.cpu > 0  # the pool's threads counted the CPU of their jobs


# -- the loader ---------------------------------------------------------------------------------------------


def test_tuned_loader_switches_settings_and_delivers_the_untuned_data(many: list[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    plain = feedfast.DataLoader(_spec(), shards=many, shuffle=True, device="cpu", num_workers=2)
    want = _epoch(plain)
    # make the model favour one thread, so that the search switches settings mid-epoch
    monkeypatch.setattr(CostModel, "predict", lambda self, n, p: (0.5 if (n, p) == (1, 2) else 2.0) * self.figures.period)
    tuned = feedfast.DataLoader(_spec(), shards=many, shuffle=True, device="cpu", num_workers=2, tune=True)
    got = _epoch(tuned, step_s=0.002)
    _same(want, got)
    report = tuned.tuning()
    assert report["state"] == "done" and report["tunable"] == ["threads", "prefetch"]
    assert [t["threads"] for t in report["trials"]] == [2, 1]
    assert all(t["batches"] == tune.MEASURE for t in report["trials"])
    assert report["reason"] and tuned.knobs.threads == report["decision"]["threads"]
    assert plain.tuning() == {"state": "off"}


def test_resumed_tuned_run_keeps_its_settings_and_the_rest_of_the_epoch(many: list[str]) -> None:
    full = _epoch(feedfast.DataLoader(_spec(), shards=many, shuffle=True, device="cpu"))
    first = feedfast.DataLoader(_spec(), shards=many, shuffle=True, device="cpu", tune=True)
    it = iter(first)
    for _ in range(tune.MIN_BUDGET + 2):
        next(it)
    assert first.tuning()["state"] == "done"
    state = first.state_dict()
    assert state["tuned"] == first.knobs.as_dict()
    first.close()
    again = feedfast.DataLoader(_spec(), shards=many, shuffle=True, device="cpu", tune=True, num_workers=1,
                                prefetch_factor=1)
    again.load_state_dict(state)
    assert again.knobs.as_dict() == state["tuned"]
    assert again.tuning()["reason"] == "resumed with the tuned settings"
    rest = _epoch(again)
    _same(full[tune.MIN_BUDGET + 2:], rest)


def test_dali_backend_tunes_its_batches_ahead_only(many: list[str]) -> None:
    loader = feedfast.DataLoader(_spec(), shards=many, device="cpu", backend="dali", tune=True)
    keys = [k for _ in _epoch(loader) for k in _]
    assert keys
    assert loader.tuning()["tunable"] == ["prefetch"]


def test_spec_sections_set_the_loader_and_tuning(many: list[str]) -> None:
    loader = feedfast.DataLoader(_spec(loader={"threads": 1, "prefetch": 3, "backend": "pil"},
                                       tune={"enabled": True, "budget": 0.5}), shards=many, device="cpu")
    assert (loader.threads, loader.prefetch, loader.backend) == (1, 3, "pil")
    assert loader.tuning()["budget_batches"] == budget_batches(0.5, len(loader))
    loader.close()
    explicit = feedfast.DataLoader(_spec(loader={"threads": 1}, tune={"enabled": True}), shards=many, device="cpu",
                                   num_workers=2, tune=False)
    assert explicit.threads == 2 and explicit.tuning() == {"state": "off"}


@pytest.mark.parametrize("section, key, value", [
    ("tune", "budget", 0), ("tune", "budget", 2), ("tune", "enabled", "yes"), ("tune", "trials", 3),
    ("loader", "threads", 0), ("loader", "backend", "gpu"), ("loader", "prefetch", True),
])
def test_bad_runtime_sections_name_the_key(section: str, key: str, value: Any, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=f"{section}.{key}"):
        load_spec(_spec(**{section: {key: value}}))


def test_tuning_settings_do_not_change_what_a_state_resumes(many: list[str]) -> None:
    a = feedfast.DataLoader(_spec(), shards=many, device="cpu")
    b = feedfast.DataLoader(_spec(tune={"enabled": True}, loader={"prefetch": 4}), shards=many, device="cpu")
    assert a.state_dict()["spec"] == b.state_dict()["spec"]


def test_a_gain_within_the_noise_is_not_taken() -> None:
    knobs = Knobs(1, 2, max_threads=2)  # one candidate: two threads
    tuner = Tuner(knobs, cores=4, budget=20)
    tuner.feed(None)
    for period in (100, 140, 70):  # the default's periods swing by 70 %
        tuner.feed(_obs(period, period - 5, loop_cpu_ms=2, process_cpu_ms=102))
    assert knobs.threads == 2  # the model predicts a second thread halves the period: tried
    tuner.feed(_obs(60, 55, loop_cpu_ms=2, process_cpu_ms=102))  # the settling batch, not measured
    for period in (80, 85, 82):  # 18 % faster than the median 100: less than half the default's spread
        tuner.feed(_obs(period, period - 5, loop_cpu_ms=2, process_cpu_ms=102))
    assert tuner.done and knobs.threads == 1 and "kept" in tuner.reason
    assert tuner.report()["trials"][0]["spread"] == pytest.approx(0.7)


def test_model_predicts_more_threads_than_cores_help_a_loader_whose_threads_stall() -> None:
    # no step: the loop waits 62 of 63 ms for 2 threads on 2 cores that keep only 0.94 of a core busy
    # (60 ms of CPU a batch: they stall on the GIL or reads), so a third thread adds 0.47 of a core
    model = CostModel(Knobs(2, 2), Figures.of([_obs(63, 62, loop_cpu_ms=1, process_cpu_ms=61, loader_cpu_ms=59.2)] * 3),
                      cores=2)
    assert model.thread_limited and not model.cpu_bound
    assert model.predict(2, 2) == pytest.approx(0.063, rel=0.01)  # the measured period, the base
    assert model.predict(3, 2) == pytest.approx(0.042, rel=0.02)  # 63 * 2 / 3
    assert model.predict(2, 4) == model.predict(2, 2)  # a deeper queue does not speed the loader that sets the pace
    # threads that keep their cores busy are not thread-limited: no gain beyond the cores (as before)
    busy = CostModel(Knobs(2, 2), Figures.of([_obs(63, 62, loop_cpu_ms=1, process_cpu_ms=121, loader_cpu_ms=120)] * 3),
                     cores=2)
    assert not busy.thread_limited and busy.predict(3, 2) == busy.predict(2, 2)
