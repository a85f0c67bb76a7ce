"""The per-step record of a meter and the lazy resolution of its GPU events.

A step is *closed* once its compute time is known (the loop asked for the next batch,
or the meter stopped) and *resolved* once its GPU idle time is known (both events
completed; always true on the host basis). Steps close and resolve in order, so the
*complete* steps (closed and resolved) are always a prefix ``[0, complete)``; figures
cover complete steps only, after the first ``warmup`` of them.
"""

from __future__ import annotations

import math
from array import array
from collections import deque

from feedfast.meter.events import TimingEvent
from feedfast.meter.stats import Totals


class StepLog:
    """Per-step waits, compute times, samples and GPU idle times.

    Args:
        gpu: Whether steps carry GPU event pairs (basis ``gpu-events``).
        warmup: How many first steps figures skip.
    """

    def __init__(self, *, gpu: bool, warmup: int) -> None:
        self.gpu = gpu
        self.warmup = warmup
        self.host_wait = array("d")
        self.compute = array("d")
        self.gpu_idle = array("d")
        self.samples = array("q")
        self._pending: deque[tuple[int, TimingEvent, TimingEvent]] = deque()
        self._resolved = 0
        self._folded = 0
        self.totals = Totals()

    @property
    def pending(self) -> int:
        """Steps whose GPU events have not both completed yet."""
        return len(self._pending)

    def add_wait(
        self, host_wait: float, samples: int, pair: tuple[TimingEvent, TimingEvent] | None
    ) -> None:
        """Open a step with its host wait, samples (-1: unknown) and event pair (A, B)."""
        index = len(self.host_wait)
        self.host_wait.append(host_wait)
        self.samples.append(samples)
        if self.gpu:
            self.gpu_idle.append(math.nan)
            if pair is not None:
                self._pending.append((index, pair[0], pair[1]))

    def add_compute(self, compute: float) -> None:
        """Close the open step with its compute time."""
        self.compute.append(compute)

    @property
    def open(self) -> bool:
        """True when a step has its wait but not yet its compute time."""
        return len(self.host_wait) > len(self.compute)

    def poll(self) -> None:
        """Resolve, oldest first, every pending pair whose two events have completed."""
        pending = self._pending
        while pending:
            index, start, end = pending[0]
            if not (end.query() and start.query()):
                return
            pending.popleft()
            self.gpu_idle[index] = max(0.0, start.elapsed_ms(end) * 1e-3)
            self._resolved = index + 1

    def complete(self) -> int:
        """How many steps, from the first, are closed and resolved."""
        closed = len(self.compute)
        return min(closed, self._resolved) if self.gpu else closed

    def wait(self, index: int) -> float:
        """Step ``index``'s wait on the meter's basis, in seconds."""
        return self.gpu_idle[index] if self.gpu else self.host_wait[index]

    def fold(self) -> Totals:
        """Add newly complete steps to the whole-run totals and return them."""
        end = self.complete()
        for i in range(max(self._folded, self.warmup), end):
            host = self.host_wait[i]
            self.totals.add(self.wait(i), host, host + self.compute[i], self.samples[i])
        self._folded = max(self._folded, end)
        return self.totals

    def span(self, lo: int, hi: int) -> tuple[Totals, list[float], list[float]]:
        """Totals, per-step waits and per-step step times of steps ``[lo, hi)``."""
        totals = Totals()
        waits: list[float] = []
        steps: list[float] = []
        for i in range(lo, hi):
            wait, host = self.wait(i), self.host_wait[i]
            step = host + self.compute[i]
            totals.add(wait, host, step, self.samples[i])
            waits.append(wait)
            steps.append(step)
        return totals, waits, steps

    def window(self, size: int) -> tuple[Totals, list[float], list[float]]:
        """The last ``size`` complete steps after warmup."""
        end = self.complete()
        return self.span(max(self.warmup, end - size), end)

    def series(self) -> tuple[list[float], list[float], list[float]]:
        """Per complete step, in order: wait on the basis, host wait and step time."""
        end = self.complete()
        waits = [self.wait(i) for i in range(end)]
        hosts = list(self.host_wait[:end])
        steps = [self.host_wait[i] + self.compute[i] for i in range(end)]
        return waits, hosts, steps
