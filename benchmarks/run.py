"""``make bench``: feedfast against hand-written DALI, the torchvision recipe, and a decode ceiling.

Generates realistic shards once (photo-like JPEGs of ImageNet sizes), then measures every
row in the same script, in alternating order over several rounds, each row in a fresh
process-local iterator; prints medians and ratios, writes JSON and a PNG chart.

Usage: python benchmarks/run.py [--samples 2048] [--rounds 5] [--batches 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rows import ROWS, time_row  # noqa: E402


def dataset(samples: int) -> list[str]:
    """The benchmark shards (made once in the cache folder), indexed."""
    from feedfast.sources.demo import synth_dataset

    return synth_dataset(samples=samples, per_shard=256, seed=1,
                         announce=lambda out: print(f"generating {samples} photo-like JPEGs in {out} (once) ...", flush=True))


STOCK = "torchvision recipe, stock Pillow"


def stock_rate(shards: list[str], args: argparse.Namespace) -> float:
    """The torchvision recipe run by ``--stock-python`` (torch with stock Pillow)."""
    cmd = [args.stock_python, str(Path(__file__).resolve().parent / "stock_row.py"), "--shards", *shards,
           "--batch-size", str(args.batch_size), "--workers", str(args.workers), "--warmup", str(args.warmup),
           "--batches", str(args.batches)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"])


def measure(shards: list[str], args: argparse.Namespace) -> dict[str, list[float]]:
    """rows -> samples/s per round, rounds alternating the row order."""
    names = list(ROWS) + ([STOCK] if args.stock_python else [])
    results: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            if name == STOCK:
                results[name].append(stock_rate(shards, args))
                print(f"round {r + 1}/{args.rounds}  {name:<26} {results[name][-1]:8.1f} samples/s", flush=True)
                continue
            make = ROWS[name][0]
            it = make(shards, args.batch_size, args.workers)
            rate = time_row(it, warmup=args.warmup, batches=args.batches)
            close = getattr(it, "close", None)
            if close:
                close()
            del it
            gc.collect()
            results[name].append(rate)
            print(f"round {r + 1}/{args.rounds}  {name:<26} {rate:8.1f} samples/s", flush=True)
    return results


def summarize(results: dict[str, list[float]], args: argparse.Namespace) -> dict:
    med = {k: statistics.median(v) for k, v in results.items()}
    ff = med["feedfast DALI CPU"]
    ceiling = med["PIL decode only (1 core)"] * args.workers
    return {
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "settings": vars(args), "rounds": results, "median_samples_per_s": med,
        "ratios": {
            "feedfast / hand-written DALI": ff / med["hand-written DALI"],
            "feedfast / torchvision recipe": ff / med["torchvision recipe"],
            "hand-written DALI / torchvision recipe": med["hand-written DALI"] / med["torchvision recipe"],
            "feedfast PIL backend / torchvision recipe": med["feedfast PIL backend"] / med["torchvision recipe"],
            f"feedfast / decode-only ceiling ({args.workers} cores)": ff / ceiling,
            **({"feedfast / torchvision recipe, stock Pillow": ff / med[STOCK]} if STOCK in med else {}),
        },
    }


def chart(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["median_samples_per_s"])
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for i, n in enumerate(names):
        ax.scatter(summary["rounds"][n], [i] * len(summary["rounds"][n]), color="0.6", s=12, zorder=2)
    ax.barh(names, [summary["median_samples_per_s"][n] for n in names], color="#4c72b0", zorder=1)
    ax.invert_yaxis()
    ax.set_xlabel("samples/s (bars: median; dots: rounds)")
    ax.set_title(f"imagenet-train, batch {summary['settings']['batch_size']}, {summary['settings']['workers']} workers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--stock-python", default=None,
                    help="an interpreter with torch and stock Pillow: adds the recipe as most users run it")
    args = ap.parse_args()
    t0 = time.perf_counter()
    shards = dataset(args.samples)
    results = measure(shards, args)
    summary = summarize(results, args)
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    (out / "bench.json").write_text(json.dumps(summary, indent=2) + "\n")
    chart(summary, out / "bench.png")
    print(f"\nmedians over {args.rounds} rounds ({time.perf_counter() - t0:.0f} s):")
    for name, rate in summary["median_samples_per_s"].items():
        print(f"  {name:<26} {rate:8.1f} samples/s")
    for name, ratio in summary["ratios"].items():
        print(f"  {name:<45} {ratio:5.2f}x")
    print(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")


if __name__ == "__main__":
    main()
