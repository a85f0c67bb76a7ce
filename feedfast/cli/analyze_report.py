"""The printed form of a ``feedfast analyze`` report (the JSON form is the dict itself)."""

from __future__ import annotations

from typing import Any

from feedfast.cli.common import table


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.1f} %"


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _run_rows(runs: dict[str, Any]) -> list[str]:
    head = f"  {'run':<10} {'samples/s':>10} {'batch ms':>9} {'wait ms':>8} {'stall':>8} {'1st batch':>9}"
    rows = [head]
    for name in ("synthetic", "cached", "cold"):
        r = runs[name]
        rows.append(f"  {name:<10} {r['samples_per_s']:>10.1f} {_num(r['batch_ms']):>9} "
                    f"{_num(r['wait_ms_per_batch']):>8} {_pct(r['stall_fraction']):>8} "
                    f"{r['time_to_first_batch_s']:>8.2f}s")
    return rows


def _where_rows(runs: dict[str, Any]) -> list[tuple[str, Any]]:
    pc = runs["cold"]["page_cache"]
    cold = (f"{_pct(pc['resident_before'])} of the shards cached before, {_pct(pc['resident_after'])} after "
            f"{pc['method']}" + (" (fetch stall is a lower bound)" if runs["cold"]["fetch_is_lower_bound"] else ""))
    return [("cached run", runs["cached"]["where"]), ("cold run", cold)]


def _stall_rows(report: dict[str, Any]) -> list[tuple[str, Any]]:
    s, d, ds = report["stalls"], report["decode"], report["dataset"]
    of = "of the cold batch time"
    rows = [
        ("prep stall", f"{s['prep_stall_ms']:.1f} ms/batch ({_pct(s['prep_stall_fraction'])} {of})"),
        ("fetch stall", f"{s['fetch_stall_ms']:.1f} ms/batch ({_pct(s['fetch_stall_fraction'])} {of}); "
                        f"start-up fetch {max(0.0, s['startup_fetch_s']):.2f} s"),  # noise can make the difference < 0
        ("fetch measured by", s["fetch_basis"]),
        ("throughput ratios", f"cached/synthetic {_num(s['prep_throughput_ratio'], '.3g')}, "
                              f"cold/cached {_num(s['fetch_throughput_ratio'], '.3g')}"),
        ("verdict", f"{s['verdict']} (stall {_pct(s['total_stall_fraction'])} in the cold run)"),
        ("decode", f"{_num(d['pil_ms_per_image'], '.2f')} ms/image ({d['benchmark']}); "
                   f"about {_pct(d['decode_share_of_prep'])} of prep"),
        ("dataset", f"{ds['shards']} shards, {ds['mean_shard_mb']:.1f} MB each on average; images "
                    f"{_num(ds['mean_image_kb'])} kB, {_num(ds['mean_megapixels'], '.2f')} MP, shorter side "
                    f"{_num(ds['mean_short_side'], '.0f')} px ({ds['images_sampled']} sampled)"),
    ]
    return rows


def _recommendation_lines(recs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in recs:
        if r["rank"] is None:
            lines.append(f"  -  {r['action']}: {r['why']}")
            continue
        lines.append(f"  {r['rank']}. {r['action']}: x{r['predicted_speedup']:.2f} -> "
                     f"{_num(r['predicted_samples_per_s'], '.0f')} samples/s, stall "
                     f"{_pct(r['predicted_stall_fraction'])} ({r['why']})")
    return lines


def show(report: dict[str, Any]) -> None:
    """Print the report."""
    step = f"{report['step_ms']:g} ms step" if report["step_ms"] else "no step (raw loop)"
    print(f"feedfast analyze: {report['spec']}\n  {report['shards']} shards, batch {report['batch_size']}, "
          f"{report['threads']} threads, placement {report['placement']}, {step}")
    print("\n".join(_run_rows(report["runs"])))
    print(table(_where_rows(report["runs"]) + _stall_rows(report)))
    print("recommendations (ranked by predicted gain):")
    print("\n".join(_recommendation_lines(report["recommendations"])))
    print(f"model: {report['model']}")
    for note in report["stalls"]["notes"]:
        print(f"note: {note}")
