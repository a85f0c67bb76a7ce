"""The meter's figures stand on enough steps: a default warm-up, a minimum before a verdict, plain words."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from feedfast.errors import UserError
from feedfast.meter import ManualClock, StallMeter, verdict
from feedfast.meter.report import effective_compute
from feedfast.meter.stats import DEFAULT_WARMUP, MIN_STEPS


def run(steps: int, *, startup_s: float = 0.1, wait_s: float = 0.002, step_s: float = 0.05,
        **settings: object) -> StallMeter:
    """A loader whose first batch takes ``startup_s`` (workers starting), then ``wait_s`` a batch."""
    clock = ManualClock()
    meter = StallMeter(samplers=False, device="cpu", clock=clock, batch_size=4, **settings)  # type: ignore[arg-type]

    def loader() -> Iterator[int]:
        for i in range(steps):
            clock.advance(startup_s if i == 0 else wait_s)
            yield i

    for _batch in meter.wrap(loader()):
        clock.advance(step_s)
    return meter


def test_the_defaults_are_stated() -> None:
    assert (DEFAULT_WARMUP, MIN_STEPS) == (10, 30)
    s = run(100).summary()
    assert s["warmup_steps"] == 10 and s["min_steps"] == 30 and s["steps"] == 90


def test_start_up_does_not_make_a_short_run_look_input_bound() -> None:
    """The issue's case: with no warm-up, a slow first batch made 20 steps read 'moderately input-bound'."""
    no_warmup = run(20, startup_s=0.1, warmup=0, min_steps=1).summary()
    assert no_warmup["verdict"] == "moderately input-bound"  # 0.138 s of 1.138 s: the start-up counted
    short = run(20).summary()
    assert short["steps"] == 10 and short["stall_fraction"] == pytest.approx(0.002 / 0.052)
    assert short["verdict"] == "too few steps"  # the figures are given, the verdict is not
    long = run(100).summary()
    assert long["verdict"] == "not input-bound" and long["stall_fraction"] == pytest.approx(0.002 / 0.052)


def test_a_verdict_from_the_minimum_on() -> None:
    assert run(DEFAULT_WARMUP + MIN_STEPS - 1).summary()["verdict"] == "too few steps"
    assert run(DEFAULT_WARMUP + MIN_STEPS).summary()["verdict"] == "not input-bound"
    assert run(5).summary()["verdict"] == "no steps measured"  # all of them in the warm-up


def test_the_window_verdict_needs_the_minimum_or_a_full_window() -> None:
    s = run(10 + 12, window=8).summary()
    assert s["verdict"] == "too few steps" and s["window"]["steps"] == 8
    assert s["window"]["verdict"] == "not input-bound"  # a full window of 8, under the minimum of 30
    assert run(10 + 5, window=8).summary()["window"]["verdict"] == "too few steps"


def test_verdict_counts_steps_when_given() -> None:
    assert verdict(0.3) == "highly input-bound"  # the fraction alone, as before
    assert verdict(0.3, steps=29) == "too few steps" and verdict(0.3, steps=30) == "highly input-bound"
    assert verdict(0.3, steps=5, min_steps=5) == "highly input-bound" and verdict(0.3, steps=0) == "no steps measured"


def test_min_steps_is_checked() -> None:
    with pytest.raises(UserError, match="min_steps"):
        StallMeter(samplers=False, min_steps=0)


def test_the_table_says_what_the_stall_costs_in_plain_words() -> None:
    text = run(100, wait_s=0.0125, step_s=0.0375).table()  # a quarter of every step waits
    assert "effective compute: of every 10 GPU-hours at this rate, 2.5 wait on data (25.0% of 1 GPU x 4.5 s" in text
    assert "left out: the first 10 step(s), warm-up; a verdict needs 30 measured steps" in text
    short = run(20).table()
    assert "too few steps (10 of 30)" in short and "too few steps to rely on" in short


def test_effective_compute_at_the_world_size_measured() -> None:
    line = effective_compute({"stall_fraction": 0.043, "wall_s": 120.0, "world_size": 8, "basis": "gpu-events",
                              "verdict": "not input-bound"})
    assert line == "of every 10 GPU-hours at this rate, 0.43 wait on data (4.3% of 8 GPUs x 120.0 s measured)"
    assert effective_compute({"stall_fraction": None}) is None
