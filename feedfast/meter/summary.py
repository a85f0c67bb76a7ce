"""Figures of a step log: the whole run, the rolling window, and the callback's flat dict."""

from __future__ import annotations

from typing import Any

from feedfast.meter.report import flatten
from feedfast.meter.stats import figures
from feedfast.meter.steps import StepLog


def window_figures(log: StepLog, size: int) -> dict[str, Any]:
    """Figures of the last ``size`` complete steps after warmup, with ``size``."""
    return {**figures(*log.window(size)), "size": size}


def run_figures(log: StepLog, window: int) -> dict[str, Any]:
    """Figures of every complete step after warmup, with percentiles (sorts the run).

    Adds ``warmup_steps`` (steps left out), ``pending_events`` (steps whose GPU events
    have not completed yet, left out until they do) and ``window``.
    """
    log.poll()
    end = log.complete()
    warmup = min(log.warmup, end)
    out = figures(*log.span(warmup, end))
    out.update(warmup_steps=warmup, pending_events=log.pending, window=window_figures(log, window))
    return out


def callback_figures(log: StepLog, window: int) -> dict[str, float]:
    """Cheap figures for a logger callback: run totals (no run percentiles) and the window.

    Whole-run sums grow one step at a time, so a callback every N steps stays O(window).
    """
    log.poll()
    return flatten({**figures(log.fold()), "window": window_figures(log, window)})
