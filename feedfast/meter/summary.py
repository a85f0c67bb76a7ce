"""Figures of a step log: the whole run, the rolling window, and the callback's flat dict."""

from __future__ import annotations

from typing import Any

from feedfast.meter.report import flatten
from feedfast.meter.stats import MIN_STEPS, figures
from feedfast.meter.steps import StepLog


def window_figures(log: StepLog, size: int, min_steps: int = MIN_STEPS) -> dict[str, Any]:
    """Figures of the last ``size`` complete steps after warmup, with ``size``.

    Its verdict needs ``min_steps`` steps, or the whole window when it is smaller.
    """
    return {**figures(*log.window(size), min_steps=min(min_steps, size)), "size": size}


def run_figures(log: StepLog, window: int, min_steps: int = MIN_STEPS) -> dict[str, Any]:
    """Figures of every complete step after warmup, with percentiles (sorts the run).

    Adds ``warmup_steps`` (steps left out), ``min_steps`` (steps the verdict needs),
    ``pending_events`` (steps whose GPU events have not completed yet, left out until they
    do) and ``window``.
    """
    log.poll()
    end = log.complete()
    warmup = min(log.warmup, end)
    out = figures(*log.span(warmup, end), min_steps=min_steps)
    out.update(warmup_steps=warmup, min_steps=min_steps, pending_events=log.pending,
               window=window_figures(log, window, min_steps))
    return out


def callback_figures(log: StepLog, window: int) -> dict[str, float]:
    """Cheap figures for a logger callback: run totals (no run percentiles) and the window.

    Whole-run sums grow one step at a time, so a callback every N steps stays O(window).
    """
    log.poll()
    return flatten({**figures(log.fold()), "window": window_figures(log, window)})
