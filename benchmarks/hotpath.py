"""The threaded path's own cost per sample: tiny images, so that decoding is next to nothing.

Issue 22 item 4: the threaded CPU path's Python per sample under 10 us. The set: 8 shards of
2,000 samples, each a 32x32 JPEG (four colour variants, as ``scale.py``'s) and a label. The
spec is imagenet-train's shape made tiny: decode, ``random_resized_crop`` to 16x16, a
horizontal flip, ``normalize`` to CHW float32; batch 256; ``shuffle=True``; ``device="cpu"``;
``backend="threads"``.

For each thread count (1, 2, 4) a fresh loader is drained for ``--batches`` batches after
two of warm-up, in this process; printed: samples/s, and this process's CPU microseconds per
sample (all threads: Python, PIL and the extension). At one thread nearly all of it is
Python holding the GIL (a 32x32 decode and a 16x16 resize take a few microseconds in C), so
that figure bounds the GIL-held time per sample from above; ``py-spy record --gil`` on
``--child`` (one loader at one thread) shows where it goes.

``--compare`` runs each thread count twice, with the batch plan (:mod:`feedfast.loader.backends.cpu.batchplan`:
the geometry planned per chunk in C, the pixels made in one call of the extension) and with it
switched off (every sample's chain walked in Python, as before it): the same pixels, the ratio
is the plan's. ``--one-call off`` keeps the plan but makes the pixels with Pillow.

Measured 2026-12-01 (2 shared cores, load 4 to 6): planned 30,608 / 51,329 / 39,388 samples/s at
1 / 2 / 4 threads (22.6, 19.5, 24.9 us CPU a sample), the Python walk 4,972 / 7,351 / 5,221
(145, 136, 191 us); ``py-spy record --gil`` on ``--child``: 5.2 us a sample with the GIL held
in the loader's threads, planned.

Usage::

    python benchmarks/hotpath.py [--batches 40] [--threads 1 2 4] [--compare] [--one-call auto|on|off]
                                 [--backend threads|dali] [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARDS, PER_SHARD, SIDE, BATCH = 8, 2000, 32, 256
SPEC = {"version": 1, "name": "hotpath",
        "pipeline": {"image": ["decode", {"random_resized_crop": {"size": 16}}, {"flip": {"horizontal": 0.5}},
                               "normalize"],
                     "label": ["label"]},
        "outputs": ["image", "label"], "batch": {"size": BATCH}, "seed": 0}


def make_set(folder: Path) -> list[str]:
    """The shards (written once into ``folder``)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    jpegs = []
    for i, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200), (120, 120, 120)]):
        img = Image.new("RGB", (SIDE, SIDE), colour)
        img.putpixel((i, i), (255, 255, 255))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        jpegs.append(buf.getvalue())
    paths = []
    for s in range(SHARDS):
        path = folder / f"hot-{s:02d}.tar"
        paths.append(str(path))
        if path.exists():
            continue
        tmp = path.with_suffix(".tmp")
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(PER_SHARD):
                n = s * PER_SHARD + i
                for ext, data in (("jpg", jpegs[n % 4]), ("cls", str(n % 1000).encode())):
                    info = tarfile.TarInfo(f"{n:08d}.{ext}")
                    info.size, info.mtime = len(data), 1_700_000_000
                    tar.addfile(info, io.BytesIO(data))
        tmp.rename(path)
    return paths


def run(paths: list[str], threads: int, batches: int, backend: str = "threads", walk: bool = False) -> dict[str, float]:
    """Drain a fresh loader at ``threads`` threads; samples/s and CPU us per sample.

    ``walk``: with the batch plan switched off (``feedfast.loader.backends.cpu.batchplan``), every sample's
    image chain walked in Python, as before the plan (the same pixels).
    """
    import feedfast
    from feedfast.loader.backends.cpu import batchplan
    saved = batchplan.ext
    if walk:
        batchplan.ext = None

    extra = {"placement": "cpu"} if backend == "dali" else {}
    loader = feedfast.DataLoader(SPEC, shards=paths, backend=backend, device="cpu", num_workers=threads,
                                 shuffle=True, prefetch_factor=2, **extra)
    it = iter(loader)
    for _ in range(2):
        next(it)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del it
    batchplan.ext = saved
    samples = batches * BATCH
    return {"threads": threads, "walk": walk, "samples_per_s": samples / wall, "cpu_us_per_sample": cpu / samples * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rounds", type=int, default=3, help="runs per thread count (the median is printed)")
    p.add_argument("--data", default=str(ROOT / "bench-results" / "hotpath-data"))
    p.add_argument("--backend", default="threads", choices=["threads", "dali"],
                   help="threads (the default) or dali (DALI's CPU pipeline: placement cpu)")
    p.add_argument("--compare", action="store_true",
                   help="also run each thread count with the batch plan off (every sample walked in Python)")
    p.add_argument("--one-call", choices=["auto", "on", "off"], default="auto",
                   help="planned samples made in one call of the extension (on), by Pillow (off), or as the "
                        "loader decides (auto: feedfast.loader.backends.cpu.batchplan.one_call)")
    p.add_argument("--json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    paths = make_set(Path(args.data))
    if args.one_call != "auto":
        from feedfast.loader.backends.cpu import batchplan
        batchplan.ONE_CALL = args.one_call == "on"
    if args.child:
        print(json.dumps(run(paths, 1, args.batches, args.backend)))
        return
    rows = []
    for threads in args.threads:
        for walk in ([False, True] if args.compare else [False]):
            got = []
            for _ in range(args.rounds):  # alternated with the other way when comparing: the same noise for both
                got.append(run(paths, threads, args.batches, args.backend, walk))
            got.sort(key=lambda r: r["samples_per_s"])
            row = got[len(got) // 2]
            rows.append(row)
            spread = ", ".join(f"{r['samples_per_s']:.0f}" for r in got)
            way = "python walk" if walk else "planned"
            print(f"{args.backend} {threads} {way:11s}: {row['samples_per_s']:9.0f} samples/s   "
                  f"{row['cpu_us_per_sample']:6.1f} us CPU per sample (median of {args.rounds}: {spread})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "cpu_count": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
