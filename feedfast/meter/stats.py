"""Pure arithmetic of the stall meter: totals, percentiles, figures, verdict.

Every function here takes numbers and returns numbers, so it is tested with plain lists.
Times are seconds on input; figures report seconds (``*_s``) and milliseconds (``*_ms``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MODERATE = 0.05
"""Stall fraction from which a run is moderately input-bound (TensorFlow profiler)."""
HIGH = 0.20
"""Stall fraction from which a run is highly input-bound."""
DEFAULT_WARMUP = 10
"""First steps a meter leaves out by default: the loader's start-up (workers starting, first
shards opening, queues filling) and the model's first steps (allocator, autotuning, compiling)
are not the steady state; counting them made 20 steps read 8.8% where 100 read 4.3%."""
MIN_STEPS = 30
"""Measured steps (after the warm-up) before a verdict is given. With 30, one step that waits
a whole step time moves the stall fraction by about 3 points, under the width of the
5-20% band; with fewer, the verdict is ``"too few steps"`` (the figures are still given)."""
TOO_FEW = "too few steps"


def verdict(stall_fraction: float | None, steps: int | None = None, min_steps: int = MIN_STEPS) -> str:
    """Classify a stall fraction measured over ``steps`` steps.

    ==============================  ==========================
    stall_fraction, steps           verdict
    ==============================  ==========================
    None, or steps == 0             ``"no steps measured"``
    steps under ``min_steps``       ``"too few steps"``
    under 0.05                      ``"not input-bound"``
    0.05 up to under 0.20           ``"moderately input-bound"``
    0.20 and over                   ``"highly input-bound"``
    ==============================  ==========================

    ``steps=None`` classifies the fraction alone (a figure known to stand on enough steps).
    """
    if stall_fraction is None or steps == 0:
        return "no steps measured"
    if steps is not None and steps < min_steps:
        return TOO_FEW
    if stall_fraction < MODERATE:
        return "not input-bound"
    if stall_fraction < HIGH:
        return "moderately input-bound"
    return "highly input-bound"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation, like numpy's default.

    Returns:
        None for an empty sequence.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Totals:
    """Running sums over steps; cheap to extend one step at a time."""

    steps: int = 0
    unsized_steps: int = 0
    wall: float = 0.0
    wait: float = 0.0
    host_wait: float = 0.0
    wait_max: float = 0.0
    samples: int = 0
    sized_wall: float = 0.0
    sized_compute: float = 0.0

    def add(self, wait: float, host_wait: float, step: float, samples: int) -> None:
        """Count one step: its wait on the basis, host wait, step time, samples (-1: unknown)."""
        self.steps += 1
        self.wall += step
        self.wait += wait
        self.host_wait += host_wait
        self.wait_max = max(self.wait_max, wait)
        if samples < 0:
            self.unsized_steps += 1
            return
        self.samples += samples
        self.sized_wall += step
        self.sized_compute += max(0.0, step - wait)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def figures(
    totals: Totals,
    waits: Sequence[float] | None = None,
    steps: Sequence[float] | None = None,
    min_steps: int = MIN_STEPS,
) -> dict[str, Any]:
    """The meter's figures for a set of steps.

    Args:
        totals: Sums over the steps.
        waits: Per-step waits on the basis (seconds), for percentiles; None skips them.
        steps: Per-step step times (seconds), for ``step_p50_ms``; None skips it.
        min_steps: Steps the verdict needs (see :func:`verdict`).

    Returns:
        ``steps``, ``samples``, ``unsized_steps``, ``wall_s``, ``wait_s``,
        ``stall_fraction``, ``host_stall_fraction``, ``wait_p50_ms``, ``wait_p95_ms``,
        ``wait_max_ms``, ``step_p50_ms``, ``samples_per_s``, ``required_samples_per_s``
        and ``verdict``. Rates use only steps whose batch size is known;
        ``required_samples_per_s`` is samples over compute time (step minus wait): the
        rate at which the loader would make the wait zero.
    """
    stall = _ratio(totals.wait, totals.wall)
    return {
        "steps": totals.steps,
        "samples": totals.samples,
        "unsized_steps": totals.unsized_steps,
        "wall_s": totals.wall,
        "wait_s": totals.wait,
        "stall_fraction": stall,
        "host_stall_fraction": _ratio(totals.host_wait, totals.wall),
        "wait_p50_ms": _ms(percentile(waits, 50)) if waits is not None else None,
        "wait_p95_ms": _ms(percentile(waits, 95)) if waits is not None else None,
        "wait_max_ms": _ms(totals.wait_max) if totals.steps else None,
        "step_p50_ms": _ms(percentile(steps, 50)) if steps is not None else None,
        "samples_per_s": _ratio(totals.samples, totals.sized_wall),
        "required_samples_per_s": _ratio(totals.samples, totals.sized_compute),
        "verdict": verdict(stall, totals.steps, min_steps),
    }
