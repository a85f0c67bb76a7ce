"""A PNG of wait and step time over a run (matplotlib, imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from feedfast.errors import UserError

_MAX_POINTS = 20_000


def _thin(values: Sequence[float], stride: int) -> list[float]:
    """The maximum of each run of ``stride`` points, so short spikes stay visible."""
    return [max(values[i : i + stride]) for i in range(0, len(values), stride)]


def plot_series(
    path: str | Path,
    *,
    waits: Sequence[float],
    host_waits: Sequence[float],
    steps: Sequence[float],
    basis: str,
    title: str = "feedfast StallMeter",
) -> Path:
    """Write a PNG of per-step wait and step time (ms) against step number.

    Runs of more than 20,000 steps are drawn as bucket maxima.

    Args:
        path: Where the PNG goes.
        waits: Per-step wait on the basis, seconds.
        host_waits: Per-step host wait, seconds (drawn too on the GPU basis).
        steps: Per-step step time (wait plus compute), seconds.
        basis: ``"gpu-events"`` or ``"host-wait"``, for the legend.
        title: The figure title.

    Returns:
        The path written.

    Raises:
        UserError: matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise UserError(
            "StallMeter.plot() needs matplotlib, which is not installed; "
            "fix: pip install matplotlib"
        ) from exc
    figure: Any = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    lines = [("step (wait + compute)", steps)]
    if basis == "gpu-events":
        lines += [("host wait", host_waits), ("GPU idle in wait", waits)]
    else:
        lines.append(("data wait (host)", waits))
    _draw(axes, lines)
    axes.set_title(title)
    out = Path(path)
    figure.savefig(out, format="png")
    return out


def _draw(axes: Any, lines: list[tuple[str, Sequence[float]]]) -> None:
    """Draw each (label, seconds per step) series in milliseconds."""
    count = len(lines[0][1])
    stride = max(1, -(-count // _MAX_POINTS))
    xs = list(range(0, count, stride))
    for label, values in lines:
        axes.plot(xs, [v * 1e3 for v in _thin(values, stride)], label=label, lw=0.8)
    axes.set_xlabel("step")
    axes.set_ylabel("ms")
    axes.legend(loc="upper right")
    axes.grid(True, alpha=0.3)
