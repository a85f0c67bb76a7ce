"""What ``feedfast watch``'s hook costs a training loop per step, in microseconds.

The hook's work per ``next()`` is :func:`feedfast.meter.startup.sitecustomize.timed_next`:
one wrapper call, the tracker's checks and the meter's two marks (two clock reads, the
batch size found in the batch's first tensor, the step record; with CUDA, two event
records and a query). Measured here (2 shared cores): about 3 to 4 us a step on host
waits, half of it finding the batch size; a few more with events.
:func:`hook_overhead` times exactly that, on the same code the job runs, against a bare
``next()`` over ready batches, as :func:`feedfast.meter.overhead.measure_overhead` does for
``meter.wrap``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from feedfast.meter.attach import JobMeter, Tracker
from feedfast.meter.events import EventFactory
from feedfast.meter.startup.sitecustomize import timed_next


class _Agent:
    """The part of an Agent a tracker calls: a host-wait meter (or one on ``events``), no samplers, no file."""

    def __init__(self, events: EventFactory | None) -> None:
        self._events = events
        self.flush_at = time.monotonic() + 2.0  # as an Agent's: the clock read each step, a (skipped) write each 2 s

    def new_meter(self, tracker: Tracker) -> JobMeter:
        return JobMeter(device="cpu", events=self._events, samplers=False)

    def write(self, *, final: bool = True, end: str | None = None) -> None:
        """Nothing to write (the next in 2 s, as an Agent's)."""
        self.flush_at = time.monotonic() + 2.0


def _loop_seconds(batches: list[Any], step: Callable[[Any], Any]) -> float:
    iterator = iter(batches)
    start = time.perf_counter()
    for _ in range(len(batches)):
        step(iterator)
    return time.perf_counter() - start


def hook_overhead(*, steps: int = 20_000, repeats: int = 5, events: EventFactory | None = None) -> float:
    """Microseconds the hook adds to one ``next()``: best of ``repeats`` loops of ``steps`` each, hooked minus bare.

    Each step yields the same ``(tensor[64, 3, 8, 8], tensor[64])`` batch, so the figure is the
    hook's alone; ``events`` (``CudaEvents()``, ``SimulatedGpu()``) adds what events cost.
    """
    import torch

    batches: list[Any] = [(torch.zeros(64, 3, 8, 8), torch.zeros(64, dtype=torch.long))] * steps  # as a loader's
    bare = min(_loop_seconds(batches, next) for _ in range(repeats))
    hooked = float("inf")
    for _ in range(repeats):
        tracker = Tracker(_Agent(events), "bench:0", "torch", {}, 0)  # type: ignore[arg-type]
        hooked = min(hooked, _loop_seconds(batches, partial(timed_next, next, tracker)))
    return max(0.0, (hooked - bare) / steps * 1e6)
