"""Images read in place at ImageNet's shape (issue 38): 1,281,024 tiny JPEGs in 1,000 class folders.

The tree (``<data>/train/c000 .. c999``, 1,281 files each, ``NNNNNNN.jpg``, one of four 8x8 JPEGs made once
with PIL, about 300 bytes) is written once and reused; decoding an 8x8 JPEG costs next to nothing, so
what is measured is feedfast's bookkeeping over a folder: the listing, its cache, the epoch's order.
Each figure is taken in a fresh process (this script with ``--child``), ``FEEDFAST_CACHE`` set to the
benchmark's own folder, the loader ``DataLoader(SPEC, shards=<tree>, batch_size=256, shuffle=True,
device="cpu")`` on the default (threaded) backend:

- cold: the listing's cache removed (the tree's directory entries left in the OS's cache): construction,
  which lists the tree (threads over class folders, a progress bar past 2 s), and the first batch;
- warm (the listing cached), at 1 rank and as rank 3 of 8: construction to first batch, and memory above
  the loader's imports after it (USS, PSS, RSS from psutil).

Targets (issue 38): warm first batch under 1 s, memory per rank under 64 MB above the imports; the cold
listing's time stated.

Usage::

    python benchmarks/folders_scale.py [--classes 1000] [--per-class 1281] [--data DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 256
SPEC = {"version": 1, "name": "folders-scale",
        "pipeline": {"image": ["decode", {"resize": {"size": [8, 8]}}, "normalize"], "label": ["label"]},
        "outputs": ["image", "label"], "batch": {"size": BATCH}, "seed": 0}
FIRST_BATCH_S, MEMORY_MB, MB = 1.0, 64.0, 1e6
MARK = "@folders "
T0 = time.perf_counter()


def make_tree(root: Path, classes: int, per_class: int) -> None:
    """Write the tree once (a marker file says it is whole)."""
    done = root / ".complete"
    if done.exists() and done.read_text() == f"{classes}x{per_class}":
        return
    import numpy as np
    from PIL import Image

    variants = []
    for v in range(4):
        out = io.BytesIO()
        Image.fromarray(np.full((8, 8, 3), 40 + 50 * v, np.uint8)).save(out, "JPEG", quality=90)
        variants.append(out.getvalue())
    shutil.rmtree(root, ignore_errors=True)
    n = 0
    for c in range(classes):
        folder = root / f"c{c:03d}"
        folder.mkdir(parents=True)
        for _ in range(per_class):
            with open(folder / f"{n:07d}.jpg", "wb") as f:
                f.write(variants[n % 4])
            n += 1
    done.write_text(f"{classes}x{per_class}")


def emit(**figures: Any) -> None:
    print(MARK + json.dumps(figures), flush=True)


def memory() -> dict[str, int]:
    import psutil

    m = psutil.Process().memory_full_info()
    return {"uss": m.uss, "pss": m.pss, "rss": m.rss}


def child(tree: str) -> None:
    """Construction and first batch, and memory above the imports after it."""
    import PIL.Image  # noqa: F401
    import torch  # noqa: F401

    import feedfast
    import feedfast.loader.backends.cpu.threads  # noqa: F401  the threaded path: the loader imports it
    import feedfast.loader.dataloader  # noqa: F401

    base = memory()
    start = time.perf_counter()
    loader = feedfast.DataLoader(SPEC, shards=tree, batch_size=BATCH, shuffle=True, device="cpu")
    constructed = time.perf_counter()
    next(iter(loader))
    first = time.perf_counter()
    now = memory()
    emit(construct=round(constructed - start, 3), first=round(first - start, 3), samples=len(loader.dataset),
         **{f"mem_{k}": now[k] - base[k] for k in now})
    loader.close()


def run_child(tree: str, cache: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    environ = {**os.environ, "FEEDFAST_CACHE": str(cache), **(env or {})}
    out = subprocess.run([sys.executable, __file__, "--child", tree], env=environ, capture_output=True, text=True,
                         timeout=1800)
    lines = [json.loads(line[len(MARK):]) for line in out.stdout.splitlines() if line.startswith(MARK)]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return lines[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--per-class", type=int, default=1281)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return
    data = args.data or ROOT / "bench-results" / "folders-data" / f"{args.classes}x{args.per_class}"
    tree = data / "train"
    t = time.perf_counter()
    make_tree(tree, args.classes, args.per_class)
    print(f"tree: {args.classes * args.per_class:,} files in {args.classes} folders ({time.perf_counter() - t:.1f} s "
          "to write or find)")
    cache = data / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cold = run_child(str(tree), cache)
    warm = run_child(str(tree), cache)
    rank = run_child(str(tree), cache, {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"})
    result = {"cold": cold, "warm_1_rank": warm, "warm_rank_3_of_8": rank}
    print(f"cold (listing included): construction {cold['construct']:.2f} s, first batch at {cold['first']:.2f} s")
    for name, r in (("warm, 1 rank", warm), ("warm, rank 3 of 8", rank)):
        ok = "met" if r["first"] < FIRST_BATCH_S and r["mem_uss"] / MB < MEMORY_MB else "NOT met"
        print(f"{name}: first batch at {r['first']:.3f} s (construction {r['construct']:.3f} s); above the imports "
              f"USS +{r['mem_uss'] / MB:.0f} MB, PSS +{r['mem_pss'] / MB:.0f} MB, RSS +{r['mem_rss'] / MB:.0f} MB "
              f"(targets {FIRST_BATCH_S:g} s, {MEMORY_MB:g} MB: {ok})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
