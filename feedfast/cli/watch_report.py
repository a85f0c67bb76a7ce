"""``feedfast watch``'s report: the processes' records read back, one row per loader, the table and its advice.

A row is a loader (where the job built it) over every process that iterated it: its figures
per rank, their aggregate (:func:`feedfast.meter.dist.aggregate`: the worst rank's wait,
summed rates), the straggler (:func:`feedfast.meter.dist.straggler`) and its advice
(:mod:`feedfast.cli.watch_advice`). Training loaders come first (torch's grad mode was on
when the loop read them), then the rest, most steps first; the table's figures below it
(basis, straggler, effective compute) are the first row's, and advice is printed for every
training loader (for the first row when none is one).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from feedfast.cli.common import gpu_cell
from feedfast.cli.watch_advice import Machine, advise
from feedfast.meter import dist, report, stats
from feedfast.meter.rankplot import plot_ranks

_FIGURES = ("steps", "samples", "unsized_steps", "wall_s", "wait_s", "stall_fraction", "host_stall_fraction",
            "wait_p50_ms", "wait_p95_ms", "wait_max_ms", "step_p50_ms", "samples_per_s", "required_samples_per_s",
            "verdict", "basis", "min_steps", "warmup_steps", "pending_events")


def load(run_dir: Path) -> list[dict[str, Any]]:
    """Every process's record in ``run_dir`` (``proc-*.json``), by rank then pid; unreadable ones as ``error``."""
    records = []
    for path in sorted(run_dir.glob("proc-*.json")):
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            records.append({"error": f"{path.name}: {exc}", "loaders": []})
    return sorted(records, key=lambda r: (r.get("rank", 0), r.get("pid", 0)))


def _rank_figures(record: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    summary, usage = entry["summary"], record.get("usage") or {}
    per_core = usage.get("cpu_per_core") or []
    out = {key: summary.get(key) for key in _FIGURES}
    out.update(rank=record.get("rank", 0), pid=record.get("pid"), host=record.get("host"), cores=record.get("cores"),
               cpu_util=usage.get("cpu_util"), gpu_util=usage.get("gpu_util"),
               cpu_busy=sum(per_core) / len(per_core) if per_core else None,
               gpu_status=(record.get("samplers") or {}).get("gpu", ""))
    if "series" in entry:
        out["series"] = entry["series"]
    return out


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per loader (site and kind), training loaders first."""
    grouped: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for record in records:
        for entry in record.get("loaders", []):
            grouped.setdefault((entry["site"], entry["kind"]), []).append((record, entry))
    out = []
    for (site, kind), pairs in grouped.items():
        facts = {k: v for k, v in pairs[0][1].items() if k not in ("site", "kind", "summary", "series")}
        ranks = [_rank_figures(rec, entry) for rec, entry in pairs if entry.get("summary")]
        grad = [e.get("grad_enabled") for _, e in pairs if e.get("grad_enabled") is not None]
        row: dict[str, Any] = {"site": site, "kind": kind, "role": ("train" if any(grad) else "eval") if grad else None,
                               "facts": facts, "ranks": ranks, "job": None, "straggler": None}
        if ranks:
            row["job"] = dist.aggregate(ranks, ranks[0].get("min_steps") or stats.MIN_STEPS)
            row["straggler"] = dist.straggler(ranks) if len(ranks) > 1 else None
        out.append(row)
    return sorted(out, key=lambda r: (r["role"] != "train", -sum(x.get("steps") or 0 for x in r["ranks"])))


def _machine(records: list[dict[str, Any]], row: dict[str, Any]) -> Machine:
    worst = (row.get("straggler") or {}).get("rank", row["ranks"][0]["rank"])
    figures = next(r for r in row["ranks"] if r["rank"] == worst)
    on_host = [r for r in records if r.get("host") == figures.get("host") and r.get("loaders")]
    cores = int(figures.get("cores") or 1)
    return Machine(cores_per_rank=max(1, cores // max(1, len(on_host))), cpu_busy=figures.get("cpu_busy"),
                   cuda=any(r.get("cuda") for r in records))


def build(records: list[dict[str, Any]], *, command: list[str], exit_status: int, wall_s: float) -> dict[str, Any]:
    """The report: the command, its status, the rows, the first row's advice and notes."""
    loader_rows = rows([r for r in records if "error" not in r])
    measured = [r for r in loader_rows if r["ranks"]]
    for row in measured:
        row["advice"] = advise(row, _machine(records, row))
    advice = measured[0]["advice"] if measured else []
    notes = [r["error"] for r in records if "error" in r]
    abrupt = [_abrupt(r) for r in records if "error" not in r and r.get("end", "exit") != "exit"]
    notes += [f"{r['site']} ({r['kind']}): one batch taken, not measured (the meter starts at a loader's second batch)"
              for r in loader_rows if not r["ranks"]]
    return {"command": command, "exit_status": exit_status, "wall_s": wall_s,
            "processes": len([r for r in records if "error" not in r]), "loaders": loader_rows, "advice": advice,
            "abrupt": abrupt, "notes": notes}


def _abrupt(record: dict[str, Any]) -> dict[str, Any]:
    """A process that did not end through its exit: how, and what of it the report saw (its last write)."""
    steps = sum((e.get("summary") or {}).get("steps") or 0 for e in record.get("loaders", []))
    warmup = sum((e.get("summary") or {}).get("warmup_steps") or 0 for e in record.get("loaders", []))
    how = {"SIGTERM": "by SIGTERM", "os._exit": "by os._exit"}.get(
        record["end"], "without exiting (SIGKILL, the OOM killer): its figures as of its last write, every 2 s")
    return {"pid": record.get("pid"), "rank": record.get("rank", 0), "end": record["end"], "how": how,
            "steps": steps, "warmup_steps": warmup, "written_at": record.get("written_at")}


def _abrupt_lines(rep: dict[str, Any]) -> list[str]:
    return [f"ended abruptly: rank {a['rank']} pid {a['pid']} {a['how']}; seen up to its last write, "
            f"{a['steps']} measured steps (after {a['warmup_steps']} of warm-up); its steps after that are not in "
            "the table" for a in rep.get("abrupt", [])]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _verdict(figures: dict[str, Any]) -> str:
    """The verdict, or how many steps the warm-up took when it took them all."""
    warmup = figures.get("warmup_steps") or 0
    if not figures.get("steps") and warmup:
        return f"warm-up only ({warmup} step{'s' if warmup != 1 else ''})"
    return str(figures.get("verdict"))


def _cells(label: str, figures: dict[str, Any], gpu: str) -> list[str]:
    rate = figures.get("samples_per_s")
    return [label, f"{figures.get('steps') or 0}", "-" if rate is None else f"{rate:,.1f}",
            _pct(figures.get("stall_fraction")), _ms(figures.get("wait_p50_ms")), _ms(figures.get("wait_p95_ms")), gpu,
            _verdict(figures)]


def _gpu(ranks: list[dict[str, Any]]) -> str:
    utils = [r["gpu_util"] for r in ranks if r.get("gpu_util") is not None]
    return f"{sum(utils) / len(utils):.0f} %" if utils else "-"


def _table(loader_rows: list[dict[str, Any]]) -> list[str]:
    lines = [["loader", "steps", "samples/s", "data wait", "wait p50", "wait p95", "GPU util", "verdict"]]
    for row in loader_rows:
        if not row["ranks"]:
            continue
        role = f", {row['role']}" if row["role"] else ""
        job = {**row["job"], "warmup_steps": min(r.get("warmup_steps") or 0 for r in row["ranks"])}
        lines.append(_cells(f"{row['site']} ({row['kind']}{role})", job, _gpu(row["ranks"])))
        if len(row["ranks"]) > 1:
            worst = (row["straggler"] or {}).get("rank")
            numbers = [r["rank"] for r in row["ranks"]]
            for r in row["ranks"]:
                pid = f" pid {r['pid']}" if numbers.count(r["rank"]) > 1 else ""  # processes outside a process group
                label = f"  rank {r['rank']}{pid}" + (" (straggler)" if r["rank"] == worst else "")
                lines.append(_cells(label, r, _gpu([r])))
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return ["  ".join(c.ljust(w) if i in (0, 7) else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip()
            for line in lines]


def _basis_line(ranks: list[dict[str, Any]]) -> str:
    bases = {r.get("basis") for r in ranks}
    if bases == {"gpu-events"}:
        return "data wait: the GPU's idle time inside the data waits, from CUDA events on the loop's stream"
    if bases == {"host-wait"}:
        return "data wait: host wait, the time inside next() (these processes did not use CUDA)"
    by = ", ".join(f"rank {r['rank']} {r.get('basis')}" for r in ranks)
    return f"data wait: on each rank's own basis ({by})"


def _advice_lines(items: list[dict[str, Any]]) -> list[str]:
    lines = []
    for item in items:
        if item["rank"] is None:
            lines.append(f"  -  {item['action']}: {item['why']}")
        elif item["predicted_speedup"] is not None:
            lines.append(f"  {item['rank']}. {item['action']}: x{item['predicted_speedup']:.2f} -> "
                         f"{item['predicted_samples_per_s']:,.0f} samples/s, data wait "
                         f"{item['predicted_stall_fraction']:.1%} ({item['why']})")
        else:
            lines.append(f"  {item['rank']}. {item['action']}: {item['why']}")
    return lines


def text(rep: dict[str, Any]) -> str:
    """The printed report: the table, what its figures mean, the straggler, effective compute and the advice."""
    head = (f"feedfast watch: {shlex.join(rep['command'])} (exit status {rep['exit_status']}, {rep['wall_s']:.1f} s, "
            f"{rep['processes']} process{'es' if rep['processes'] != 1 else ''} measured)")
    measured = [r for r in rep["loaders"] if r["ranks"]]
    if not measured:
        return "\n".join([head + ": no DataLoader was iterated, nothing to measure", *_abrupt_lines(rep),
                          *rep["notes"]])
    first = measured[0]
    lines = [head, *_table(rep["loaders"]), _basis_line(first["ranks"])]
    worst = first["straggler"]
    if worst:
        others = ", ".join(f"rank {r['rank']} {_pct(r.get('stall_fraction'))}" for r in first["ranks"]
                           if r["rank"] != worst["rank"])
        lines.append(f"straggler: rank {worst['rank']} waited {worst.get('wait_s') or 0.0:.2f} s for data "
                     f"({_pct(worst.get('stall_fraction'))} of its steps; {others}); under DDP every rank waits for it")
    compute = report.effective_compute({**first["job"], "world_size": len(first["ranks"]),
                                        "basis": first["ranks"][0].get("basis")})
    if compute:
        lines.append(f"effective compute: {compute}")
    lines.append(f"left out: each loader's first batch and the next {first['ranks'][0].get('warmup_steps')} steps "
                 f"(warm-up); a verdict needs {first['ranks'][0].get('min_steps')} measured steps")
    if _gpu(first["ranks"]) == "-":
        lines.append(f"GPU utilization: {gpu_cell(None, first['ranks'][0].get('gpu_status') or '')}")
    for row in [r for r in measured if r["role"] == "train"] or [first]:
        lines.append(f"what next for {row['site']} ({row['job']['verdict']}):")
        lines.extend(_advice_lines(row["advice"]))
    lines.extend(_abrupt_lines(rep))
    lines.extend(f"note: {n}" for n in rep["notes"])
    return "\n".join(lines)


def plot(rep: dict[str, Any], path: str) -> Path:
    """``--plot``: the first loader's step and wait per step, a panel per rank."""
    measured = [r for r in rep["loaders"] if r["ranks"]]
    panels = [{"label": f"rank {r['rank']} ({r.get('basis')})", "basis": r.get("basis"),
               **(r.get("series") or {})} for r in (measured[0]["ranks"] if measured else [])]
    return plot_ranks(path, panels, title=f"feedfast watch: {measured[0]['site'] if measured else 'no loader'}")
