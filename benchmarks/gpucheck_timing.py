"""``gpu_check.py``'s clock for a loader alone: first batch, rate, and the epoch boundary against the batch period.

A loader is iterated one epoch at a time (``for batch in loader``, again and again, as a training loop does) and
every batch's arrival is stamped on the host. From the stamps:

- the first batch: seconds from creating the loader to it;
- the rate: images over ``count`` batches after ``Sizes.warmup`` warm-up batches, the device synchronized at both
  ends of that window;
- the batch period: the median gap between two batches of one epoch;
- the epoch boundaries: the gap between an epoch's last batch and the next epoch's first, one per boundary crossed
  (iteration goes on past the window until at least ``min_boundaries`` were).

A gap whose wait held a device synchronization (the window's two ends) is left out of the period and the
boundaries. The stamps are host time without a synchronization per batch: in steady state a loader's batches
cannot arrive faster than it makes them, so the host's gaps are its period; a gap that hides queued device work
shows as a shorter one, never as a longer one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpucheck_common import Context
from gpucheck_sections import synchronizer


@dataclass
class EpochTiming:
    """What :func:`timed_epochs` measured."""

    first: Any  # the first batch
    first_s: float  # seconds from the loader's creation to the first batch
    images_per_s: float  # over the measured window
    period_s: float | None  # median gap between two batches of one epoch
    boundaries_s: list[float] = field(default_factory=list)  # an epoch's last batch to the next one's first, each
    epochs: int = 0  # epochs started
    batches: int = 0  # batches taken in all

    @property
    def worst_boundary_periods(self) -> float | None:
        """The longest epoch boundary in batch periods (None without a boundary or a period)."""
        if not self.boundaries_s or not self.period_s:
            return None
        return max(self.boundaries_s) / self.period_s

    def summary(self) -> dict[str, Any]:
        """The figures, JSON-safe, for a section's data."""
        return {"first_batch_s": self.first_s, "images_per_s": self.images_per_s, "period_s": self.period_s,
                "boundaries_s": self.boundaries_s, "worst_boundary_periods": self.worst_boundary_periods,
                "epochs": self.epochs, "batches": self.batches}

    def boundary_note(self) -> str:
        """The boundaries in words: how many, the worst and the median, against the period."""
        if not self.boundaries_s or not self.period_s:
            return f"no epoch boundary measured ({self.epochs} epochs, {self.batches} batches)"
        return (f"{len(self.boundaries_s)} boundaries over {self.epochs} epochs: worst {max(self.boundaries_s) * 1e3:.1f} ms, "
                f"median {statistics.median(self.boundaries_s) * 1e3:.1f} ms; batch period {self.period_s * 1e3:.1f} ms "
                f"(median within an epoch)")


def timed_epochs(loader: Iterable[Any], ctx: Context, started: float, count: int, *,
                 min_boundaries: int = 2) -> EpochTiming:
    """Iterate ``loader`` epoch after epoch until the measured window (``Sizes.warmup`` then ``count`` batches) is
    over and at least ``min_boundaries`` epoch boundaries were crossed; ``started``: when the loader was created.

    Raises:
        RuntimeError: an epoch yielded no batch.
        OverBudget: the run's time budget ran out (checked every batch).
    """
    sync = synchronizer(ctx.cuda)
    window = (ctx.sizes.warmup + 1, ctx.sizes.warmup + count)  # indices of the measured batches, inclusive
    stamps: list[tuple[int, float, bool]] = []  # (epoch, arrival, whether the gap before it is clean)
    first: Any = None
    t0 = rate = 0.0
    images = boundaries = 0
    epoch = 0
    while True:
        empty = True
        for batch in loader:
            now = time.perf_counter()
            empty, index = False, len(stamps)
            clean = index not in (window[0], window[1] + 1)  # a synchronization sits in the gaps before these
            stamps.append((epoch, now, clean))
            if index and clean and stamps[index - 1][0] != epoch:
                boundaries += 1
            if index == 0:
                first = batch
            if window[0] <= index <= window[1]:
                images += int(batch[0].shape[0])
            if index == window[0] - 1:
                sync()
                t0 = time.perf_counter()
            if index == window[1]:
                sync()
                rate = images / (time.perf_counter() - t0)
            ctx.budget.check()
            if index >= window[1] and boundaries >= min_boundaries:
                return _timing(first, stamps[0][1] - started, rate, stamps, epoch + 1)
        if empty:
            raise RuntimeError(f"the loader yielded no batch in epoch {epoch}")
        epoch += 1


def _timing(first: Any, first_s: float, rate: float, stamps: list[tuple[int, float, bool]],
            epochs: int) -> EpochTiming:
    periods: list[float] = []
    boundaries: list[float] = []
    for (prev_epoch, prev_t, _), (ep, t, clean) in zip(stamps, stamps[1:]):
        if clean:
            (periods if ep == prev_epoch else boundaries).append(t - prev_t)
    period = statistics.median(periods) if periods else None
    return EpochTiming(first, first_s, rate, period, boundaries, epochs, len(stamps))
