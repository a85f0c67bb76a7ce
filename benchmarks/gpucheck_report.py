"""``gpu_check.py``'s output: the final table and the JSON report."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from gpucheck_common import Context, Row, Section


def fmt(figure: float | str | None) -> str:
    """A figure for the table."""
    if figure is None:
        return "-"
    if isinstance(figure, (str, int)):
        return str(figure)
    if abs(figure) >= 100:
        return f"{figure:,.0f}"
    return f"{figure:.2f}" if abs(figure) >= 1 else f"{figure:.3f}"


def table_rows(sections: Sequence[Section]) -> list[Row]:
    """Every section's rows, titled; a skipped or failed section gets a row with its note."""
    rows = []
    for sec in sections:
        rows += [replace(r, what=f"{sec.title}: {r.what}" if r.what else sec.title) for r in sec.rows]
        if sec.status != "ok":
            rows.append(Row(sec.title, None, "", sec.note))
    return rows


def clip(note: str, width: int = 160) -> str:
    """A note cut to ``width`` characters for the table (the JSON keeps it whole)."""
    return note if len(note) <= width else note[: width - 3] + "..."


HEADER = ("what", "samples/s", "stall", "GPU util %", "1st batch s", "figure", "note")
"""The one table's columns: a feed's four figures (samples/s, the meter's GPU stall fraction, NVML
utilization, seconds to the first batch), or another row's figure with its unit, then the note."""


def cells(row: Row) -> tuple[str, ...]:
    """One row's cells, in :data:`HEADER` order."""
    figure = "" if row.figure is None and not row.unit else f"{fmt(row.figure)} {row.unit}".rstrip()
    feed = (row.samples_per_s, row.stall, row.gpu_util, row.first_batch_s)
    is_feed = any(v is not None for v in feed)
    return (row.what, *((fmt(v) if is_feed else "") for v in feed), figure, clip(row.note))


def render(rows: Sequence[Row]) -> str:
    """The final table, aligned: text left, figures right."""
    table = [HEADER] + [cells(r) for r in rows]
    widths = [max(len(c[i]) for c in table) for i in range(len(HEADER) - 1)]
    lines = []
    for c in table:
        left = f"{c[0]:<{widths[0]}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(c[1:-2], widths[1:-1]))
        lines.append(f"{left}  {c[-2]:<{widths[-1]}}  {c[-1]}".rstrip())
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)


def environment(ctx: Context) -> dict[str, Any]:
    """Versions and the device, for the JSON."""
    dali = sys.modules.get("nvidia.dali")
    return {"python": platform.python_version(), "torch": torch.__version__,
            "dali": getattr(dali, "__version__", None), "cuda": ctx.cuda, "dry_run": ctx.dry,
            "device": torch.cuda.get_device_name(0) if ctx.cuda else "cpu",
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


def write_json(path: str, code: int | None, ctx: Context, sections: Sequence[Section], rows: Sequence[Row], *,
               complete: bool = True, limit_s: float | None = None) -> None:
    """Everything the run measured so far, its settings and environment, and the table, as JSON.

    Written after every section (``complete`` false, ``exit_code`` null until the end; 3 when the outer
    limit ended the run), through a temporary file, so a reader never sees half a report.
    """
    out = {"version": 1, "complete": complete, "exit_code": code, "wall_s": ctx.budget.elapsed(),
           "budget_s": ctx.budget.seconds, "limit_s": limit_s, "environment": environment(ctx),
           "sizes": asdict(ctx.sizes), "sections": {s.name: asdict(s) for s in list(sections)},
           "table": [asdict(r) for r in rows]}
    target = Path(path)
    part = target.with_name(target.name + ".part")
    part.write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(part, target)
