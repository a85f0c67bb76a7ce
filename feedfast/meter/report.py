"""Reports of a meter's summary: a flat dict for loggers, JSON, and a text table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

_ROWS = (
    ("steps", "steps", "{:d}"),
    ("samples", "samples", "{:d}"),
    ("wall_s", "wall (s)", "{:.2f}"),
    ("stall_fraction", "stall fraction", "{:.1%}"),
    ("host_stall_fraction", "host-wait fraction", "{:.1%}"),
    ("wait_p50_ms", "wait p50 (ms)", "{:.2f}"),
    ("wait_p95_ms", "wait p95 (ms)", "{:.2f}"),
    ("wait_max_ms", "wait max (ms)", "{:.2f}"),
    ("step_p50_ms", "step p50 (ms)", "{:.2f}"),
    ("samples_per_s", "samples/s", "{:,.1f}"),
    ("required_samples_per_s", "needed samples/s", "{:,.1f}"),
    ("verdict", "verdict", "{}"),
)
_USAGE = (
    ("cpu_util", "cpu_util_max", "CPU, process tree (%)"),
    ("gpu_util", "gpu_util_max", "GPU utilization (%)"),
    ("gpu_sm_active", "gpu_sm_active_max", "GPU SM active (%)"),
    ("gpu_mem_mb", "gpu_mem_max_mb", "GPU memory (MiB)"),
)


def flatten(summary: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric figures of a summary as one flat dict, for loggers.

    Nested dicts join their keys with ``/`` (``window/stall_fraction``), list items take
    their index (``cpu_per_core/0``); strings, booleans, None and NaN are left out, so
    the result suits TensorBoard ``add_scalars``, W&B ``log`` and Lightning ``log_dict``.

    Args:
        summary: A dict from :meth:`StallMeter.summary`.
        prefix: Put before every key, e.g. ``"data/"``.
    """
    flat: dict[str, float] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}/"))
        elif isinstance(value, list):
            flat.update(flatten({str(i): v for i, v in enumerate(value)}, f"{name}/"))
        elif _is_number(value):
            flat[name] = value
    return flat


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not (isinstance(value, float) and math.isnan(value))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def to_json(summary: dict[str, Any], path: str | Path | None = None) -> str:
    """The summary as JSON (NaN and infinities become null), written to ``path`` if given.

    Returns:
        The JSON text.
    """
    text = json.dumps(_json_safe(summary), indent=2, sort_keys=True)
    if path is not None:
        Path(path).write_text(text + "\n", encoding="utf-8")
    return text


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def _verdict_cell(figures: dict[str, Any], min_steps: Any) -> str:
    shown = _cell(figures.get("verdict"), "{}")
    if figures.get("verdict") == "too few steps" and min_steps:
        shown += f" ({figures.get('steps')} of {min_steps})"
    return shown


def effective_compute(summary: dict[str, Any]) -> str | None:
    """The stall in plain words: of every 10 GPU-hours at this rate, how many wait on data.

    At the world size (``world_size``, 1 without a gather) and wall time measured; None
    when no step was measured.
    """
    stall, wall = summary.get("stall_fraction"), summary.get("wall_s") or 0.0
    if stall is None:
        return None
    world = summary.get("world_size") or 1
    hours = 10 * stall
    waited = f"{hours:.1f}" if hours >= 1 else f"{hours:.2f}"
    gpus = f"{world} GPU{'s' if world > 1 else ''}"
    line = (f"of every 10 GPU-hours at this rate, {waited} wait on data "
            f"({stall:.1%} of {gpus} x {wall:.1f} s measured")
    if summary.get("basis") == "host-wait":
        line += ", as host wait"
    if summary.get("verdict") == "too few steps":
        line += "; too few steps to rely on"
    return line + ")"


def _ranks_lines(summary: dict[str, Any]) -> list[str]:
    if "ranks" not in summary:
        return []
    lines = [f"{summary.get('world_size')} ranks; run figures {summary.get('aggregate')}"]
    mean = summary.get("stall_fraction_mean")
    if mean is not None:
        lines.append(f"mean stall fraction over ranks: {mean:.1%}")
    worst = summary.get("straggler") or {}
    if worst.get("stall_fraction") is not None:
        lines.append(f"straggler: rank {worst.get('rank')}, waited {worst.get('wait_s') or 0.0:.2f} s "
                     f"({worst['stall_fraction']:.1%}, {worst.get('verdict')})")
    return lines


def table(summary: dict[str, Any]) -> str:
    """A printable table of the run and the rolling window, then resource use.

    Returns:
        Lines of text, no trailing newline.
    """
    window = summary.get("window") or {}
    head = ("", "run", f"last {window.get('size', '?')} steps")
    if "ranks" in summary:  # the run column is the job's; the window is this rank's
        head = ("", f"run, {summary.get('world_size')} ranks", f"{head[2]}, this rank")
    rows = [head]
    for key, label, fmt in _ROWS:
        rows.append((label, _cell(summary.get(key), fmt), _cell(window.get(key), fmt)))
    min_steps = summary.get("min_steps")
    window_min = min(min_steps, window["size"]) if min_steps and window.get("size") else min_steps
    rows[-1] = ("verdict", _verdict_cell(summary, min_steps), _verdict_cell(window, window_min))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    widths[0] = max(widths[0], *(len(label) for _, _, label in _USAGE))
    lines = [f"StallMeter ({summary.get('basis')}: {summary.get('basis_note')})"]
    for row in rows:
        lines.append(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}")
    compute = effective_compute(summary)
    if compute:
        lines.append(f"effective compute: {compute}")
    warmup = summary.get("warmup_steps")
    if warmup is not None:
        lines.append(f"left out: the first {warmup} step(s), warm-up; a verdict needs {min_steps} measured steps")
    lines.extend(_ranks_lines(summary))
    lines.append("")
    for mean_key, max_key, label in _USAGE:
        mean, peak = summary.get(mean_key), summary.get(max_key)
        shown = "unavailable" if mean is None else f"mean {mean:.1f}, max {peak:.1f}"
        lines.append(f"{label:<{widths[0]}}  {shown}")
    for name, status in (summary.get("samplers") or {}).items():
        if status != "ok":
            lines.append(f"sampler {name}: {status}")
    if summary.get("pending_events"):
        lines.append(f"{summary['pending_events']} recent step(s) await their GPU events")
    return "\n".join(lines)
