"""A simulated dataset of 100M samples: construction and the epoch plan, time and memory per rank.

Writing 100M real samples is out of reach here, and the figures are about bookkeeping, so the
dataset is simulated at the layer feedfast reads at start-up: ``--shards`` sparse tar files
(declared sizes, no payload), a one-line text index beside each, and the two records a
previous open would have left in the cache, generated as arrays: the opened-dataset record
(:mod:`feedfast.shards.index.snapshot`) and the columnar index (:mod:`feedfast.shards.index.columnar`:
offsets, sizes and keys of every sample). Then, in a fresh process per rank setting, it
times ``feedfast.DataLoader(...)`` (construction) and the epoch plan (``epoch_plan()`` and the
rows of the first, a middle and the last batch, with their keys), and reports the memory
above the loader's imports (``feedfast``, torch, PIL, the threaded backend): private
(anonymous) memory, and apart from it the pages of the mapped index resident in the process
(clean page cache, shared by the ranks of a node: the kernel maps it in 2 MB folios, so a
batch of samples spread over a 5 GB index maps hundreds of MB of it). No sample is decoded:
the tars are empty.

Usage: ``python benchmarks/scale_sim.py [--samples 100000000] [--shards 8000] [--data DIR] [--json out]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SPEC = {"version": 1, "name": "scale-sim",
        "pipeline": {"image": ["decode", {"resize": {"size": [8, 8]}}, "normalize"], "label": ["label"]},
        "outputs": ["image", "label"], "batch": {"size": 256}, "seed": 0}
MEMBER = 1536  # bytes a sample takes in a tar: two headers and two padded payloads


def write_dataset(data: Path, samples: int, shards: int) -> Path:
    """The sparse shards, their indexes and the cache records; returns the cache folder."""
    sys.path.insert(0, str(HERE.parent))
    from feedfast.compile.build import build_plan
    from feedfast.shards.index import columnar, snapshot
    from feedfast.sources.dataset import _record_name
    from feedfast.spec.load import load_spec

    cache = data / "cache"
    counts = np.full(shards, samples // shards, dtype=np.int64)
    counts[: samples % shards] += 1
    data.mkdir(parents=True, exist_ok=True)
    paths = [str(data / f"sim-{i:06d}.tar") for i in range(shards)]
    idxs = [p[: -len(".tar")] + ".idx" for p in paths]
    for path, idx, n in zip(paths, idxs, counts.tolist()):
        if not os.path.exists(idx):
            with open(path, "wb") as f:
                f.truncate(n * MEMBER + 1024)
            Path(idx).write_text(f"v1.2 {n}\n")
    spec = load_spec(SPEC)
    record = _record_name(paths, spec, spec.on_error, _max_pixels())
    assert record is not None
    snapshot.save(cache, record, snapshot.Opened(tuple(paths), tuple(idxs), tuple(counts.tolist()), (), (),
                                                 int(counts.sum()) * MEMBER))
    exts = build_plan(spec, device="cpu", consumer="cpu").component_exts()
    folder = cache / "columnar" / columnar._digest(paths, idxs, counts.tolist(), [sorted(e) for e in exts])
    if not (folder / "done").is_file():
        _write_columnar(folder, counts)
    return cache


def _max_pixels() -> int:
    from feedfast.checks.validate import DEFAULT_MAX_PIXELS

    return DEFAULT_MAX_PIXELS


def _write_columnar(folder: Path, counts: np.ndarray, chunk: int = 1 << 22) -> None:
    """The columnar index of the simulated shards, written a chunk at a time (keys ``s%010d``)."""
    total = int(counts.sum())
    folder.mkdir(parents=True, exist_ok=True)
    starts = np.concatenate([[0], np.cumsum(counts)])
    np.save(folder / "starts.npy", starts)
    rows = np.lib.format.open_memmap(folder / "rows.npy", mode="w+", dtype=np.int64, shape=(total, 6))
    shard_of = np.repeat(np.arange(len(counts)), counts)
    digits = 10 ** np.arange(9, -1, -1, dtype=np.int64)
    with open(folder / "keys.bin", "wb") as keys:
        for a in range(0, total, chunk):
            b = min(total, a + chunk)
            within = np.arange(a, b) - starts[shard_of[a:b]]
            rows[a:b, 0] = within * MEMBER + 512
            rows[a:b, 1] = within * MEMBER + 1536
            rows[a:b, 2:4] = 512
            rows[a:b, 4] = np.arange(a, b) * 11
            rows[a:b, 5] = 11
            text = np.full((b - a, 11), ord("s"), dtype=np.uint8)  # keys s0000000000, s0000000001, ...
            text[:, 1:] = ord("0") + (np.arange(a, b)[:, None] // digits) % 10
            keys.write(text.tobytes())
    rows.flush()
    (folder / "done").write_text("")


CHILD = r"""
import json, os, sys, time, resource
import psutil, torch, feedfast, numpy as np
import PIL.Image, feedfast.loader.backends.cpu.threads  # what the loader imports: its memory is not the loader's
from feedfast.order.orders import epoch_rows
proc = psutil.Process()
def mem():
    m = proc.memory_full_info()
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith("Rss"))
    kb = {k: int(v.split()[0]) * 1024 for k, v in status.items()}
    return {"rss": m.rss, "uss": m.uss, "pss": getattr(m, "pss", 0), "anon": kb.get("RssAnon", 0),
            "file": kb.get("RssFile", 0)}
base = mem()
t0, c0 = time.perf_counter(), time.process_time()
loader = feedfast.DataLoader(json.loads(sys.argv[1]), shards=sys.argv[2], device="cpu", shuffle=True)
t1, c1 = time.perf_counter(), time.process_time()
ep = loader.epoch_plan()
exts = loader.plan.component_exts()
rows = epoch_rows(loader.shards, exts, ep, rank=loader.rank, world=loader.world, seed=0, epoch=0, shuffle=True)
keys = []
for step in (0, ep.steps // 2, ep.steps - 1):
    first = step * ep.batch_size
    where = rows.take(np.minimum(np.arange(first, first + ep.batch_size), len(rows) - 1))
    keys.append(rows.index.keys(where.samples[:2]))
t2, c2 = time.perf_counter(), time.process_time()
after = mem()
print(json.dumps({"construct_s": t1 - t0, "construct_cpu_s": c1 - c0, "plan_s": t2 - t1, "plan_cpu_s": c2 - c1,
                  "steps": ep.steps, "rank_samples": ep.rank_samples, "keys": keys,
                  "mem": {k: after[k] - base[k] for k in after}, "total": loader.shards.total}))
"""


def measure(data: Path, cache: Path, rank: int, world: int) -> dict[str, object]:
    """One fresh process as rank ``rank`` of ``world``: construction and epoch-plan figures."""
    env = {**os.environ, "FEEDFAST_CACHE": str(cache), "RANK": str(rank), "WORLD_SIZE": str(world),
           "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world), "PYTHONPATH": str(HERE.parent)}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(SPEC), str(data / "sim-*.tar")], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000_000)
    ap.add_argument("--shards", type=int, default=8000)
    ap.add_argument("--data", type=Path, default=HERE.parent / "bench-results" / "scale-sim")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t = time.perf_counter()
    cache = write_dataset(args.data, args.samples, args.shards)
    print(f"simulated {args.samples:,} samples in {args.shards:,} shards ({time.perf_counter() - t:.0f} s)")
    results = {f"rank {r} of {w}": measure(args.data, cache, r, w) for r, w in ((0, 1), (3, 8))}
    print(f"{'figure':34} {'1 rank':>12} {'rank 3 of 8':>12}  target")
    one, eight = results["rank 0 of 1"], results["rank 3 of 8"]
    for label, key, unit, target in (("construction, wall", "construct_s", "s", "< 5 s"),
                                     ("construction, CPU", "construct_cpu_s", "s", ""),
                                     ("epoch plan + 3 batches' rows, wall", "plan_s", "s", "< 5 s"),
                                     ("epoch plan + 3 batches' rows, CPU", "plan_cpu_s", "s", "")):
        print(f"{label:34} {one[key]:>11.3f}{unit} {eight[key]:>11.3f}{unit}  {target}")
    for kind, label, target in (("anon", "private (anonymous) memory", "< 1 GB"),
                                ("file", "mapped files resident (the index)", "shared"),
                                ("rss", "RSS", ""), ("pss", "PSS", "")):
        print(f"{label + ' above import':34} {one['mem'][kind] / 2**20:>10.1f}MB "  # type: ignore[index]
              f"{eight['mem'][kind] / 2**20:>10.1f}MB  {target}")  # type: ignore[index]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"samples": args.samples, "shards": args.shards, **results}, indent=1))


if __name__ == "__main__":
    main()
