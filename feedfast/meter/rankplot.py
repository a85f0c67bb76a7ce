"""A PNG of one loader's wait and step time over a run, one panel per rank (``feedfast watch --plot``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from feedfast.errors import UserError

MAX_PANELS = 8
"""Ranks drawn; a larger job's panels are its first ranks and its straggler."""


def thin(values: Sequence[float], stride: int) -> list[float]:
    """The maximum of each run of ``stride`` values, so that short spikes stay visible.

    >>> thin([1.0, 3.0, 2.0, 0.0, 5.0], 2)
    [3.0, 2.0, 5.0]
    """
    if stride <= 1:
        return list(values)
    return [max(values[i : i + stride]) for i in range(0, len(values), stride)]


def plot_ranks(path: str | Path, panels: Sequence[dict[str, Any]], *, title: str) -> Path:
    """Write a PNG: for each panel, step time and data wait (ms) against step number.

    Args:
        path: Where the PNG goes.
        panels: One dict per rank: ``label``, ``basis``, ``stride`` (steps per point),
            ``wait_s`` and ``step_s`` (seconds per point).
        title: The figure's title (the loader's name).

    Returns:
        The path written.

    Raises:
        UserError: matplotlib is not installed, or there is nothing to draw.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise UserError("--plot needs matplotlib, which is not installed; fix: pip install matplotlib") from exc
    shown = [p for p in panels if p.get("step_s")][:MAX_PANELS]
    if not shown:
        raise UserError("--plot: no loader step was measured, so there is nothing to draw")
    figure: Any = Figure(figsize=(10, 1.0 + 2.2 * len(shown)), dpi=100)
    FigureCanvasAgg(figure)
    axes_list = figure.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
    for axes, panel in zip(axes_list, shown):
        stride = int(panel.get("stride") or 1)
        xs = [i * stride for i in range(len(panel["step_s"]))]
        wait_label = "GPU idle in data wait" if panel.get("basis") == "gpu-events" else "data wait (host)"
        axes.plot(xs, [v * 1e3 for v in panel["step_s"]], label="step (wait + compute)", lw=0.8)
        axes.plot(xs, [v * 1e3 for v in panel["wait_s"]], label=wait_label, lw=0.8)
        axes.set_ylabel("ms")
        axes.set_ylim(bottom=0)
        axes.set_title(panel["label"], fontsize=9, loc="left")
        axes.grid(True, alpha=0.3)
        axes.legend(loc="upper right", fontsize=8)
    axes_list[-1].set_xlabel("step (after the loader's first batch)")
    figure.suptitle(title)
    out = Path(path)
    figure.savefig(out, format="png")
    return out
