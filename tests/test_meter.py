"""StallMeter on the host basis: accuracy against real sleeps, and the measuring API.

The truth of each accuracy scenario is timed by the test itself, independently of the
meter: :class:`Timed` times every ``next()`` on the loader (sleeps plus whatever the
loader does around them, such as a DataLoader's collate) and :class:`FakeStep` times the
step. Nominal sleep lengths only shape the scenario: on a busy machine sleeps overrun and
loader code is preempted, and that time is real waiting the meter must count.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from feedfast.errors import UserError
from feedfast.meter import ManualClock, StallMeter, measure_overhead

T = TypeVar("T")


class Timed:
    """Wraps a loader and times every ``next()`` that returns a batch."""

    def __init__(self, loader: Iterable[T]) -> None:
        self.loader = loader
        self.spent = 0.0

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.spent += time.perf_counter() - start
            yield batch


def sleepy(waits_s: list[float], batch: int = 8) -> Iterator[torch.Tensor]:
    """Sleeps a known time before each batch."""
    for wait in waits_s:
        if wait > 0:
            time.sleep(wait)
        yield torch.zeros(batch, 3)


class FakeStep:
    """A training step of known length, keeping the time it really took."""

    def __init__(self) -> None:
        self.spent = 0.0

    def __call__(self, seconds: float) -> None:
        start = time.perf_counter()
        time.sleep(seconds)
        self.spent += time.perf_counter() - start


def measure(loader: Iterable[Any], steps_s: list[float]) -> tuple[dict[str, Any], float]:
    timed, step = Timed(loader), FakeStep()
    meter = StallMeter(samplers=False, device="cpu", warmup=0)  # the truth counts every step
    for i, _batch in enumerate(meter.wrap(timed)):
        step(steps_s[i])
    return meter.summary(), timed.spent / (timed.spent + step.spent)


SCENARIOS = {
    "none": ([0.0] * 30, [15.0] * 30, 0.0),
    "about-10pc": ([5.0] * 20, [45.0] * 20, 0.10),
    "about-50pc": ([10.0] * 30, [10.0] * 30, 0.50),
    "varying": ([5.0, 20.0, 0.0, 10.0, 30.0] * 6, [15.0, 5.0, 20.0, 10.0, 10.0] * 6, 65 / 125),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_stall_fraction_within_two_points_of_truth(name: str) -> None:
    waits_ms, steps_ms, nominal = SCENARIOS[name]
    for _attempt in range(3):  # a busy machine can deschedule the loop between the meter's clock and the truth's
        summary, truth = measure(sleepy([w / 1e3 for w in waits_ms]), [s / 1e3 for s in steps_ms])
        if abs(summary["stall_fraction"] - truth) < 0.02:
            break
    assert summary["steps"] == len(waits_ms)
    assert summary["samples"] == 8 * len(waits_ms)
    assert summary["basis"] == "host-wait"
    assert abs(summary["stall_fraction"] - truth) < 0.02, (summary["stall_fraction"], truth)
    # The scenario stays in its regime even when a busy machine stretches its times.
    assert abs(truth - nominal) < 0.15, "the scenario drifted far from its nominal times"


class SleepyDataset(Dataset[tuple[torch.Tensor, int]]):
    """Sleeps in __getitem__."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.sleep_s)
        return torch.zeros(3, 4, 4), index % 2


def test_torch_dataloader_within_two_points_of_truth() -> None:
    loader = DataLoader(SleepyDataset(n=60, sleep_s=0.005), batch_size=2, num_workers=0)
    summary, truth = measure(loader, [0.010] * 30)
    assert summary["steps"] == 30 and summary["samples"] == 60
    assert abs(summary["stall_fraction"] - truth) < 0.02, (summary["stall_fraction"], truth)
    assert summary["verdict"] == "highly input-bound"


def manual_meter(**settings: Any) -> tuple[StallMeter, ManualClock]:
    """A meter on a manual clock; every step counts and one gives a verdict unless ``settings`` say otherwise."""
    clock = ManualClock()
    settings = {"warmup": 0, "min_steps": 1, **settings}
    return StallMeter(samplers=False, device="cpu", clock=clock, **settings), clock


def ticking(clock: ManualClock, waits: list[float], batch: int = 8) -> Iterator[torch.Tensor]:
    for wait in waits:
        clock.advance(wait)
        yield torch.zeros(batch)


def test_figures_are_exact_on_a_manual_clock() -> None:
    meter, clock = manual_meter()
    for _batch in meter.wrap(ticking(clock, [0.005] * 10)):
        clock.advance(0.015)
    s = meter.summary()
    assert s["steps"] == 10 and s["samples"] == 80
    assert s["wall_s"] == pytest.approx(0.2)
    assert s["stall_fraction"] == pytest.approx(0.25)
    assert s["wait_p50_ms"] == pytest.approx(5.0) and s["wait_max_ms"] == pytest.approx(5.0)
    assert s["samples_per_s"] == pytest.approx(400.0)
    assert s["required_samples_per_s"] == pytest.approx(80 / 0.15)
    assert s["verdict"] == "highly input-bound"


def test_warmup_and_window() -> None:
    meter, clock = manual_meter(warmup=2, window=3)
    waits = [0.100, 0.100, 0.0, 0.0, 0.0, 0.010, 0.010, 0.010]
    for _batch in meter.wrap(ticking(clock, waits)):
        clock.advance(0.010)
    s = meter.summary()
    assert s["steps"] == 6 and s["warmup_steps"] == 2
    assert s["stall_fraction"] == pytest.approx(0.03 / 0.09)
    assert s["window"]["steps"] == 3 and s["window"]["size"] == 3
    assert s["window"]["stall_fraction"] == pytest.approx(0.5)


def test_batch_size_override_and_callable() -> None:
    meter, clock = manual_meter(batch_size=32)
    for _batch in meter.wrap(ticking(clock, [0.001] * 4)):
        clock.advance(0.001)
    assert meter.summary()["samples"] == 128
    meter, clock = manual_meter(batch_size=lambda b: int(b.sum()) + 1)
    for _batch in meter.wrap(ticking(clock, [0.001] * 4)):
        clock.advance(0.001)
    assert meter.summary()["samples"] == 4


def test_unsized_batches_warn_and_are_counted() -> None:
    meter, clock = manual_meter()
    with pytest.warns(RuntimeWarning, match="batch size"):
        for _batch in meter.wrap(iter([["a", "b"], ["c"]])):
            clock.advance(0.001)
    s = meter.summary()
    assert s["steps"] == 2 and s["unsized_steps"] == 2 and s["samples"] == 0
    assert s["samples_per_s"] is None


def test_explicit_forms_match_wrap() -> None:
    meter, clock = manual_meter()
    it = ticking(clock, [0.005] * 3)
    batch = meter.fetch(it)
    clock.advance(0.015)
    with meter.wait() as w:
        w.batch = batch = next(it)
    clock.advance(0.015)
    meter.wait_begin()
    batch = next(it)
    meter.wait_end(batch)
    clock.advance(0.015)
    with pytest.raises(StopIteration):
        meter.fetch(it)
    s = meter.summary()
    assert s["steps"] == 3 and s["samples"] == 24
    assert s["stall_fraction"] == pytest.approx(0.25)


def test_step_end_leaves_out_the_pause_and_break_closes_the_step() -> None:
    meter, clock = manual_meter()
    for i, _batch in enumerate(meter.wrap(ticking(clock, [0.010] * 10))):
        clock.advance(0.010)
        if i == 1:
            meter.step_end()
            clock.advance(5.0)  # evaluation, not part of any step
        if i == 3:
            break
    s = meter.summary()
    assert s["steps"] == 4 and s["wall_s"] == pytest.approx(0.08)


def test_epochs_accumulate_and_loader_errors_pass_through() -> None:
    meter, clock = manual_meter()
    for _epoch in range(2):
        for _batch in meter.wrap(ticking(clock, [0.010] * 3)):
            clock.advance(0.010)

    def broken() -> Iterator[torch.Tensor]:
        yield torch.zeros(2)
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        for _batch in meter.wrap(broken()):
            clock.advance(0.010)
    s = meter.summary()
    assert s["steps"] == 7 and s["samples"] == 50


def test_wait_end_without_wait_begin_is_a_user_error() -> None:
    meter, _clock = manual_meter()
    with pytest.raises(UserError, match="wait_begin"):
        meter.wait_end(torch.zeros(2))


def test_callback_every_n_steps_gets_flat_numbers() -> None:
    seen: list[dict[str, float]] = []
    meter, clock = manual_meter(every=4, callback=seen.append, window=4)
    for _batch in meter.wrap(ticking(clock, [0.010] * 10)):
        clock.advance(0.030)
    assert len(seen) == 2
    assert seen[1]["steps"] == 8 and seen[1]["stall_fraction"] == pytest.approx(0.25)
    assert seen[1]["window/steps"] == 4 and "window/wait_p95_ms" in seen[1]
    assert all(isinstance(v, (int, float)) for v in seen[1].values())


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"window": 0}, "window"),
        ({"warmup": -1}, "warmup"),
        ({"every": 5}, "every"),
        ({"callback": print}, "callback"),
        ({"batch_size": 0}, "batch_size"),
        ({"device": "tpu"}, "device"),
        ({"sample_hz": 0}, "sample_hz"),
        ({"samplers": [object()]}, "samplers"),
    ],
)
def test_bad_settings_name_the_field(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(UserError, match=named):
        StallMeter(**settings)


def test_auto_device_without_cuda_reports_host_wait() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert StallMeter(samplers=False).basis == "host-wait"
    with pytest.raises(UserError, match="CUDA"):
        StallMeter(device="cuda", samplers=False)


def test_meter_overhead_per_step_is_small() -> None:
    microseconds = measure_overhead(steps=5000, repeats=3)
    assert microseconds < 200.0, f"meter costs {microseconds:.1f} us per step"


def test_a_wrap_closed_late_leaves_the_newer_loop_alone() -> None:
    meter, clock = manual_meter()
    old = meter.wrap(ticking(clock, [0.010] * 5))
    next(old)
    clock.advance(0.010)
    for _batch in meter.wrap(ticking(clock, [0.010] * 3)):
        clock.advance(0.005)
        old.close()  # an abandoned iterator collected mid-step must not end this step
        clock.advance(0.005)
    s = meter.summary()
    assert s["steps"] == 4 and s["wall_s"] == pytest.approx(0.08)


def test_explicit_batch_size_is_checked() -> None:
    meter, _clock = manual_meter()
    meter.wait_begin()
    with pytest.raises(UserError, match="batch_size"):
        meter.wait_end(None, batch_size=-1)
    with pytest.raises(UserError, match="batch_size"):
        meter.wait(batch_size=-1)
