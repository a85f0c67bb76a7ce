"""What the meter itself costs per step."""

from __future__ import annotations

import time
from typing import Any

from feedfast.meter.events import EventFactory


def _loop_seconds(batches: list[Any], meter: Any | None) -> float:
    source = batches if meter is None else meter.wrap(batches)
    start = time.perf_counter()
    for _batch in source:
        pass
    return time.perf_counter() - start


def measure_overhead(
    *,
    steps: int = 20_000,
    repeats: int = 5,
    events: EventFactory | None = None,
    batch: Any = None,
) -> float:
    """Microseconds the meter adds to one step of a loop over ready batches.

    Times ``for b in meter.wrap(batches): pass`` against ``for b in batches: pass``
    (best of ``repeats`` each, samplers off, since they run in their own threads) and
    returns the difference per step: the two clock reads, the bookkeeping, the batch
    size inference and, with ``events``, two event records and a query per step.

    Args:
        steps: Steps per timed loop.
        repeats: Timed loops of each kind; the fastest counts.
        events: An event factory (``CudaEvents()``, ``SimulatedGpu()``); None
            measures the host-wait meter.
        batch: What each step yields; a ``(tensor[64, 3, 8, 8], tensor[64])``-shaped
            stand-in by default.

    Returns:
        The meter's cost in microseconds per step.
    """
    from feedfast.meter.meter import StallMeter

    if batch is None:
        batch = (_Shaped((64, 3, 8, 8)), _Shaped((64,)))
    batches = [batch] * steps
    plain = min(_loop_seconds(batches, None) for _ in range(repeats))
    metered = float("inf")
    for _ in range(repeats):
        meter = StallMeter(device="cpu", events=events, samplers=False)
        metered = min(metered, _loop_seconds(batches, meter))
        meter.summary()
    return max(0.0, (metered - plain) / steps * 1e6)


class _Shaped:
    """A tensor stand-in: only a ``shape``, so the benchmark needs no torch."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
