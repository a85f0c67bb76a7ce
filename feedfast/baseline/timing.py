"""One timed round of a loader: how ``feedfast bench --compare`` and ``make bench`` both time.

A round builds a fresh loader (``make()``), takes ``plan.warmup`` batches untimed, times
``plan.count`` batches (or ``plan.seconds``), and closes the loader before it returns, so the
next round, of this loader or another, runs alone: nothing built in an earlier round keeps
working (a feedfast threads-backend loader starts its next epoch ahead; closing stops that)
and no round starts on a queue the loader filled while another was timed. The timed batches
are those of the loader's first epoch as long as warm-up plus timed batches fit in it.

Samples are delivered samples: the loader's ``delivered()`` count where it has one (feedfast's
loaders, which leave their padding out), else each batch's rows. CPU seconds are those of this
process and its live child processes (a DataLoader's workers) over the timed batches.

``feedfast bench --compare`` (:mod:`feedfast.cli.bench`) and ``make bench``
(``benchmarks/rows.py``) both call :func:`time_round`, so the two time a round the same way.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

from feedfast.baseline.measure import RunPlan, all_processes, timed_run
from feedfast.meter import StallMeter


def time_round(make: Callable[[], Iterator[Any]], plan: RunPlan) -> tuple[dict[str, Any], StallMeter]:
    """Build a loader, time it under ``plan``, close it; its figures and the round's stopped meter.

    Args:
        make: builds the loader: an endless iterator of batches, with ``close()`` (called when
            the round ends, also on an error) and ``delivered()`` (its running count of
            delivered samples) where it has them.
        plan: warm-up and timed batches (or seconds), simulated step, progress bar.

    Returns:
        :func:`~feedfast.baseline.measure.timed_run`'s figures (``samples_per_s``, ``samples``,
        ``cpu_s``, ``time_to_first_batch_s`` counted from the call to ``make``, ...) and meter.
    """
    started = time.perf_counter()
    loader = make()
    try:
        return timed_run(loader, plan, started=started, delivered=getattr(loader, "delivered", None),
                         processes=all_processes)
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()
        del loader
        gc.collect()  # what the loader held goes now, not inside the next round's timed batches


def samples_per_cpu_s(figs: dict[str, Any]) -> float | None:
    """Delivered samples per CPU second of a round, or of rounds combined; None without CPU time.

    On a machine shared with other work the wall-clock rates swing with the others' load, the
    CPU each sample costs much less: this is what the rate becomes on a quiet machine for a
    loader that keeps its cores busy.
    """
    return figs["samples"] / figs["cpu_s"] if figs["cpu_s"] > 0 else None
