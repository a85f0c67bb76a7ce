"""A clock-backed stand-in for a CUDA stream and its events.

:class:`SimulatedGpu` keeps a simulated GPU timeline on a host clock so the meter's
CUDA-event logic runs, unchanged, on a machine without a GPU. Work "launched" on it
queues behind earlier work the way kernels queue on a stream; an event recorded on it
completes when the simulated GPU reaches it, and ``query()`` says so without blocking.

Example, with a manual clock so every figure is exact::

    clock = ManualClock()
    gpu = SimulatedGpu(clock=clock, sleep=clock.advance)
    meter = StallMeter(events=gpu, clock=clock, samplers=False)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from feedfast.meter.events import TimingEvent


class ManualClock:
    """A clock that moves only when told to; callable like ``time.perf_counter``.

    Args:
        start: The initial reading in seconds.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        """Return the current reading in seconds."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (negative values are ignored)."""
        if seconds > 0:
            self.now += seconds


class SimulatedEvent:
    """An event on a :class:`SimulatedGpu` timeline."""

    __slots__ = ("_gpu", "time")

    def __init__(self, gpu: SimulatedGpu) -> None:
        self._gpu = gpu
        self.time: float | None = None

    def record(self) -> None:
        """Place the event behind all work launched so far."""
        self.time = self._gpu.reach_time()

    def query(self) -> bool:
        """True once the simulated GPU has reached the event."""
        return self.time is not None and self._gpu.clock() >= self.time

    def elapsed_ms(self, end: TimingEvent) -> float:
        """Milliseconds from this event to ``end`` on the simulated timeline."""
        if not isinstance(end, SimulatedEvent) or self.time is None or end.time is None:
            raise ValueError("both events must be recorded SimulatedEvents")
        return (end.time - self.time) * 1e3


class SimulatedGpu:
    """A one-stream GPU timeline driven by a host clock; an EventFactory.

    Args:
        clock: The host clock in seconds (``time.perf_counter`` by default).
        sleep: How :meth:`synchronize` waits for the timeline (``time.sleep`` by
            default; ``ManualClock.advance`` for a manual clock).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.clock = clock
        self._sleep = sleep
        self.busy_until = float("-inf")

    def __call__(self) -> SimulatedEvent:
        """Return a new, unrecorded event on this timeline."""
        return SimulatedEvent(self)

    def describe(self) -> str:
        """Say what the events measure."""
        return "simulated GPU (clock-backed events)"

    def reach_time(self) -> float:
        """When the GPU reaches something enqueued now: after queued work, never before now."""
        return max(self.clock(), self.busy_until)

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of GPU work; returns at once, like a kernel launch."""
        self.busy_until = self.reach_time() + seconds

    def idle(self) -> bool:
        """True when all launched work has finished."""
        return self.clock() >= self.busy_until

    def synchronize(self) -> None:
        """Block the host until all launched work has finished, like ``cuda.synchronize``."""
        self._sleep(max(0.0, self.busy_until - self.clock()))
