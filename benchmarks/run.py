"""``make bench``: feedfast against hand-written DALI, the torchvision recipe, and a decode ceiling.

Two sets of natural photographs (see ``benchmarks/photos.py`` for where they come from),
made once in feedfast's cache folder:

- ``imagenet``: ImageNet-like JPEGs (shorter side 300 to 500 px), batch ``--batch-size``;
- ``highres``: 2 to 14 megapixel JPEGs, where reduced-size decoding applies, batch
  ``--highres-batch-size``.

(``--sets synthetic`` runs the synthetic photo-like set of earlier reports, for comparison.)
Every row of a set is measured in the same script, in alternating order over several rounds,
each row in a fresh iterator; medians, ratios with the issue's targets marked met or not,
JSON and a PNG chart per set.

Usage: python benchmarks/run.py [--sets imagenet,highres] [--rounds 5] [--batches 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rows import RECIPE_ROWS, ROWS, RowUnavailable, time_row_cpu  # noqa: E402

from feedfast.baseline.rounds import ratio_spread, round_order  # noqa: E402

STOCK = "torchvision recipe, stock Pillow"
THREADS, HAND, TORCH = "feedfast threaded CPU", "hand-written DALI", "torchvision recipe"
CEILING = "PIL decode only (1 core)"
SPDL = "SPDL thread pipeline"
PEERS = (TORCH, STOCK, SPDL)
"""The Python peers: the issue's target is against the best of them (the torchvision recipe and SPDL)."""
BEST_PEER = "best of torchvision recipe and SPDL"
RECIPE_THREADS, RECIPE_TORCH, RECIPE_HAND = RECIPE_ROWS


@dataclass(frozen=True)
class BenchSet:
    """One data set and how it is timed."""

    name: str
    rows: tuple[str, ...]
    batch_size: int
    batches: int
    warmup: int
    targets: dict[str, float]
    stock: bool = True
    """Whether ``--stock-python``'s imagenet-train recipe runs in this set (not in the recipe set: other work)."""


def bench_sets(args: argparse.Namespace) -> dict[str, BenchSet]:
    every = tuple(ROWS)
    return {
        "imagenet": BenchSet("imagenet", every, args.batch_size, args.batches, args.warmup,
                             {f"{THREADS} / {HAND}": 1.2, f"{THREADS} / {BEST_PEER}": 2.0,
                              f"{THREADS} / decode-only ceiling": 0.6}),
        "highres": BenchSet("highres", (THREADS, "feedfast DALI CPU", HAND, TORCH, SPDL), args.highres_batch_size,
                            args.highres_batches, args.highres_warmup, {f"{THREADS} / {TORCH}": 5.0}),
        "synthetic": BenchSet("synthetic", every, args.batch_size, args.batches, args.warmup, {}),
        "recipe": BenchSet("recipe", tuple(RECIPE_ROWS), args.batch_size, args.batches, args.warmup,
                           {f"{RECIPE_THREADS} / {RECIPE_TORCH}": 2.5}, stock=False),
    }


def dataset(name: str, args: argparse.Namespace) -> list[str]:
    """The set's shards (made once in the cache folder), indexed."""
    if name == "synthetic":
        from feedfast.write.demo import synth_dataset

        return synth_dataset(samples=args.samples, per_shard=256, seed=1,
                             announce=lambda out: print(f"generating {args.samples} photo-like JPEGs in {out} (once)"))
    from photos import photo_dataset

    if name == "recipe":
        return photo_dataset("imagenet", samples=args.samples, per_shard=256)  # the imagenet set's photos
    if name == "highres":
        return photo_dataset("highres", samples=args.highres_samples, per_shard=16)
    return photo_dataset("imagenet", samples=args.samples, per_shard=256)


def stock_rate(shards: list[str], bench: BenchSet, args: argparse.Namespace) -> tuple[float, float]:
    """The torchvision recipe run by ``--stock-python`` (torch with stock Pillow)."""
    cmd = [args.stock_python, str(Path(__file__).resolve().parent / "stock_row.py"), "--shards", *shards,
           "--batch-size", str(bench.batch_size), "--workers", str(args.workers), "--warmup", str(bench.warmup),
           "--batches", str(bench.batches)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{args.stock_python} could not run the recipe: {last}")
    line = json.loads(out.stdout.strip().splitlines()[-1])
    return float(line["samples_per_s"]), float(line["cpu_ms_per_sample"])


def run_row(name: str, shards: list[str], bench: BenchSet, args: argparse.Namespace) -> tuple[float, float]:
    """One round of one row, in a fresh iterator closed at its end: (samples/s, CPU ms per sample).

    Raises:
        RowUnavailable: the row cannot run here (a package it needs is missing).
    """
    if name == STOCK:
        try:
            return stock_rate(shards, bench, args)
        except RuntimeError as exc:
            raise RowUnavailable(str(exc)) from exc
    make = (ROWS.get(name) or RECIPE_ROWS[name])[0]
    return time_row_cpu(lambda: make(shards, bench.batch_size, args.workers), warmup=bench.warmup,
                        batches=bench.batches)


@dataclass
class Measured:
    """Per row, (samples/s, CPU ms per sample) of each round; the rows left out and why; the load seen."""

    results: dict[str, list[tuple[float, float]]]
    left_out: dict[str, str]
    loads: list[float]


def measure(shards: list[str], bench: BenchSet, args: argparse.Namespace) -> Measured:
    """Every row of ``bench`` over ``args.rounds`` rounds, the row order alternating between rounds.

    A row that cannot run here is left out, loudly (printed, and named in the JSON), and the
    others run on.
    """
    names = [n for n in bench.rows if not args.rows or n in args.rows]
    names += [STOCK] if bench.stock and args.stock_python and (not args.rows or STOCK in args.rows) else []
    out = Measured({name: [] for name in names}, {}, [])
    for r, order in enumerate(round_order(names, args.rounds)):
        for name in order:
            if name in out.left_out:
                continue
            try:
                got = run_row(name, shards, bench, args)
            except RowUnavailable as exc:
                print(f"{bench.name}: leaving out {name!r}: {exc}", flush=True)
                out.left_out[name] = str(exc)
                del out.results[name]
                continue
            out.results[name].append(got)
            out.loads.append(os.getloadavg()[0])
            print(f"{bench.name} round {r + 1}/{args.rounds}  {name:<32} {got[0]:8.1f} samples/s  "
                  f"{got[1]:6.2f} CPU ms/sample  (load {out.loads[-1]:.1f})", flush=True)
    return out


def ratios(med: dict[str, float], workers: int) -> dict[str, float]:
    """Each contender against the others, from medians of the rounds (higher is better for the first)."""
    out: dict[str, float] = {}
    for num in (THREADS, "feedfast DALI CPU"):
        for den in (HAND, TORCH, STOCK, SPDL, "feedfast PIL backend"):
            if num in med and den in med:
                out[f"{num} / {den}"] = med[num] / med[den]
        peers = [med[p] for p in PEERS if p in med]
        if num in med and peers:
            out[f"{num} / {BEST_PEER}"] = med[num] / max(peers)
        if CEILING in med and num in med:
            out[f"{num} / decode-only ceiling"] = med[num] / (med[CEILING] * workers)
    if HAND in med and TORCH in med:
        out[f"{HAND} / {TORCH}"] = med[HAND] / med[TORCH]
    if SPDL in med and TORCH in med:
        out[f"{SPDL} / {TORCH}"] = med[SPDL] / med[TORCH]
    for den in (RECIPE_TORCH, RECIPE_HAND):
        if RECIPE_THREADS in med and den in med:
            out[f"{RECIPE_THREADS} / {den}"] = med[RECIPE_THREADS] / med[den]
    if RECIPE_HAND in med and RECIPE_TORCH in med:
        out[f"{RECIPE_HAND} / {RECIPE_TORCH}"] = med[RECIPE_HAND] / med[RECIPE_TORCH]
    return out


def round_spreads(results: dict[str, list[tuple[float, float]]], workers: int) -> dict[str, dict]:
    """Each ratio of :func:`ratios` per round (round k's figures only: rows alternate within a round), and
    its spread over the rounds, wall-clock and per core."""
    rounds = min(len(v) for v in results.values())
    out: dict[str, dict] = {}
    for kind, figure, scale in (("wall", lambda r: r[0], workers), ("per_core", lambda r: 1e3 / r[1], 1)):
        per_round = [ratios({k: figure(v[n]) for k, v in results.items()}, scale) for n in range(rounds)]
        for name in per_round[0] if per_round else ():
            values = [r[name] for r in per_round]
            out.setdefault(name, {})[kind] = ratio_spread(values, [1.0] * len(values)).to_dict()
    return out


def summarize(measured: Measured, bench: BenchSet, args: argparse.Namespace) -> dict:
    """Medians and ratios two ways: wall-clock samples/s, and samples per CPU second ("per core").

    On a shared machine the wall-clock figures swing with other work; the CPU cost per sample
    much less. The per-core figure is ``1000 / median CPU ms per sample``; its ratios are what
    the wall-clock ratios become on a quiet machine for rows that keep their cores busy.
    """
    results = {k: v for k, v in measured.results.items() if v}
    med = {k: statistics.median(r for r, _ in v) for k, v in results.items()}
    per_core = {k: 1e3 / statistics.median(c for _, c in v) for k, v in results.items()}
    wall, cpu = ratios(med, args.workers), ratios(per_core, 1)
    peers = {"wall": max((p for p in PEERS if p in med), key=med.__getitem__, default=None),
             "per_core": max((p for p in PEERS if p in per_core), key=per_core.__getitem__, default=None)}
    targets = {name: {"target": t, "wall": wall.get(name), "per_core": cpu.get(name),
                      "met_wall": wall.get(name, 0.0) >= t, "met_per_core": cpu.get(name, 0.0) >= t}
               for name, t in bench.targets.items()}
    return {
        "set": bench.name, "batch_size": bench.batch_size, "batches": bench.batches, "warmup": bench.warmup,
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_average_at_end": os.getloadavg(),
                    "load_average_1min": {"per_round": measured.loads, "min": min(measured.loads, default=None),
                                          "median": statistics.median(measured.loads) if measured.loads else None,
                                          "max": max(measured.loads, default=None)}},
        "settings": vars(args), "rounds": {k: [r for r, _ in v] for k, v in results.items()},
        "cpu_ms_per_sample_rounds": {k: [c for _, c in v] for k, v in results.items()},
        "median_samples_per_s": med, "samples_per_cpu_s": per_core, "ratios": wall, "ratios_per_core": cpu,
        "targets": targets, "best_peer": peers, "left_out": measured.left_out,
        "ratio_spreads": round_spreads(results, args.workers),
    }


def chart(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["median_samples_per_s"])
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.2))
    for i, n in enumerate(names):
        ax.scatter(summary["rounds"][n], [i] * len(summary["rounds"][n]), color="0.6", s=12, zorder=2)
    ax.barh(names, [summary["median_samples_per_s"][n] for n in names], color="#4c72b0", zorder=1)
    ax.invert_yaxis()
    ax.set_xlabel("samples/s (bars: median; dots: rounds)")
    ax.set_title(f"imagenet-train on the {summary['set']} photos, batch {summary['batch_size']}, "
                 f"{summary['settings']['workers']} workers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(summary: dict) -> None:
    print(f"\n{summary['set']}: medians over {len(next(iter(summary['rounds'].values())))} rounds")
    print(f"  {'':<32} {'samples/s':>10} {'per CPU s':>10}")
    for name, rate in summary["median_samples_per_s"].items():
        print(f"  {name:<32} {rate:10.1f} {summary['samples_per_cpu_s'][name]:10.1f}")
    for name, why in summary["left_out"].items():
        print(f"  {name:<32} left out: {why}")
    peers = summary["best_peer"]
    if peers["wall"]:
        print(f"  best Python peer: {peers['wall']} (wall), {peers['per_core']} (per core)")
    load = summary["machine"]["load_average_1min"]
    if load["median"] is not None:
        print(f"  load average (1 min) after each round: {load['min']:.1f} to {load['max']:.1f}, "
              f"median {load['median']:.1f}")
    print(f"  {'ratio':<60} {'wall':>6} {'per core':>9}")
    for name, ratio in summary["ratios"].items():
        target = summary["targets"].get(name)
        mark = ""
        if target:
            mark = (f"  target >= {target['target']:g}x: wall {'met' if target['met_wall'] else 'NOT met'}, "
                    f"per core {'met' if target['met_per_core'] else 'NOT met'}")
        print(f"  {name:<60} {ratio:5.2f}x {summary['ratios_per_core'][name]:7.2f}x{mark}")
        spread = summary["ratio_spreads"].get(name)
        if spread:
            wall, cpu = spread["wall"], spread["per_core"]
            print(f"  {'':<60} per round: wall median {wall['median']:.2f}x, {wall['low']:.2f}-{wall['high']:.2f} "
                  f"(IQR {wall['q1']:.2f}-{wall['q3']:.2f}); per core {cpu['low']:.2f}-{cpu['high']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="imagenet,highres,recipe",
                    help="comma-separated: imagenet, highres, recipe (imagenet-train-recipe.yaml), synthetic")
    ap.add_argument("--samples", type=int, default=2048, help="images in the imagenet (or synthetic) set")
    ap.add_argument("--highres-samples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--highres-batch-size", type=int, default=16)
    ap.add_argument("--highres-batches", type=int, default=8)
    ap.add_argument("--highres-warmup", type=int, default=2)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rows", type=lambda text: text.split(","), default=None,
                    help=f"comma-separated row names to run (default all): {', '.join([*ROWS, *RECIPE_ROWS, STOCK])}")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--stock-python", default=None,
                    help="an interpreter with torch and stock Pillow: adds the recipe as most users run it")
    args = ap.parse_args()
    t0 = time.perf_counter()
    sets = bench_sets(args)
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    summaries = []
    for name in args.sets.split(","):
        if name not in sets:
            ap.error(f"--sets: unknown set {name!r}; choose from {', '.join(sets)}")
        summary = summarize(measure(dataset(name, args), sets[name], args), sets[name], args)
        (out / f"bench-{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
        chart(summary, out / f"bench-{name}.png")
        summaries.append(summary)
    for summary in summaries:
        report(summary)
    print(f"\n{time.perf_counter() - t0:.0f} s; wrote bench-<set>.json and .png in {out}")


if __name__ == "__main__":
    main()
