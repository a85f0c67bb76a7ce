"""Soak: many epochs through feedfast.DataLoader; reports resident memory growth.

Usage: python benchmarks/soak.py [--epochs 20] [--shards PATTERN] [--json out.json]

RSS is sampled after each epoch, once the loader closed that epoch's pipeline. Reported: growth (last minus first epoch), the growth of
the median of the last five epochs over the median of epochs 1 to 5 (robust to batches in
flight), and the least-squares slope in MB per epoch over epochs 1 onwards (a leak shows as
a steady positive slope; epoch 0 holds DALI's one-time allocations).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import psutil

import feedfast
from feedfast.cli.common import demo_shards, find_spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--spec", default="imagenet-train")
    ap.add_argument("--shards", default=None, help="default: the demo dataset")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    proc = psutil.Process()
    loader = feedfast.DataLoader(find_spec(args.spec), shards=args.shards or demo_shards(), batch_size=args.batch_size,
                                 shuffle=True)
    rss, t0 = [], time.perf_counter()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        pinned = loader.ring.pinned_bytes
        loader.close()  # measure what stays between epochs, not the batches in flight
        rss.append(proc.memory_info().rss / 2**20)
        print(f"epoch {epoch:3d}  rss {rss[-1]:8.1f} MB  pinned {pinned / 2**20:.1f} MB", flush=True)
    stats = loader.stats()
    tail = rss[1:] or rss
    xs = list(range(len(tail)))
    mx, my = sum(xs) / len(xs), sum(tail) / len(tail)
    var = sum((x - mx) ** 2 for x in xs) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, tail)) / var
    out = {"epochs": args.epochs, "rss_mb": [round(r, 1) for r in rss], "rss_growth_mb": round(rss[-1] - rss[0], 1),
           "median_growth_mb": round(statistics.median(rss[-5:]) - statistics.median(rss[1:6] or rss), 1),
           "slope_mb_per_epoch": round(slope, 2),
           "wall_s": round(time.perf_counter() - t0, 1), "stats": stats,
           "samples_per_epoch": loader.shards.total}
    print(json.dumps({k: v for k, v in out.items() if k != "rss_mb"}))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
