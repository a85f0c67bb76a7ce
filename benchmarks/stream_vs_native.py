"""Stream vs native: the same spec and shards read by DALI's reader and over HTTP.

Usage: python benchmarks/stream_vs_native.py [--rounds 3] [--spec imagenet-train] [--no-shuffle]
                                             [--server thread|process] [--json out.json]

The demo dataset (``feedfast.cli.common.demo_shards``) is served by a threaded HTTP server
with Range support and keep-alive on 127.0.0.1 (``tests/rangeserver.py``), in a thread of
this process (default; the server then competes for this process's GIL) or in a process
of its own (closer to a real remote server, but it still shares this machine's cores).
Both loaders live in this process: each is built and warmed up with one epoch; then, in
alternating order, each round times one full epoch of each. The table shows median
images/s and the ratio http/native.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import feedfast  # noqa: E402
from feedfast.cli.common import demo_shards, find_spec  # noqa: E402
from feedfast.sources.shardlist import resolve_shards  # noqa: E402
from tests.rangeserver import RangeServer  # noqa: E402


def epoch_rate(loader: feedfast.DataLoader) -> float:
    """Images per second over one full epoch (pipeline build included)."""
    t0, n = time.perf_counter(), 0
    for _batch in loader:
        n += loader.last_valid
    return n / (time.perf_counter() - t0)


@contextlib.contextmanager
def serve(folder: Path, how: str) -> Iterator[tuple[str, RangeServer | None]]:
    """The base URL of an HTTP server over ``folder``: a thread here, or a child process."""
    if how == "thread":
        with RangeServer(folder) as srv:
            yield srv.url, srv
        return
    proc = subprocess.Popen([sys.executable, "-m", "tests.rangeserver", str(folder)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip(), None
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spec", default="imagenet-train")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=None, help="loader threads (default: all cores)")
    ap.add_argument("--no-shuffle", action="store_true", help="read in file order (coalesced HTTP reads)")
    ap.add_argument("--server", choices=("thread", "process"), default="thread")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    local = resolve_shards(demo_shards())
    # DALI on both sides (the default CPU backend is the threaded path, which reads local shards only);
    # under shuffle the local side reads the global order through the same feed (order/orders.py)
    kw: dict[str, Any] = {"batch_size": args.batch_size, "num_workers": args.workers, "backend": "dali"}
    if args.no_shuffle:
        kw["shuffle"] = False
    with serve(Path(local[0]).parent, args.server) as (base, srv):
        urls = [f"{base}/{Path(p).name}" for p in local]
        loaders = {"native": feedfast.DataLoader(find_spec(args.spec), shards=local, **kw),
                   "http": feedfast.DataLoader(find_spec(args.spec), shards=urls, **kw)}
        for loader in loaders.values():
            epoch_rate(loader)  # warm-up: page cache, index caches, first pipeline
        rates: dict[str, list[float]] = {name: [] for name in loaders}
        for r in range(args.rounds):
            order = list(loaders) if r % 2 == 0 else list(reversed(loaders))
            for name in order:
                rates[name].append(epoch_rate(loaders[name]))
        requests = sum(1 for m, _, rng in srv.requests if m == "GET" and rng) if srv else None
    med = {name: statistics.median(v) for name, v in rates.items()}
    print(f"{args.spec}, {len(local)} shards, {loaders['native'].shards.total} images, batch {args.batch_size}, "
          f"shuffle {'off' if args.no_shuffle else 'spec'}, server in a {args.server}, {args.rounds} alternating rounds")
    print(f"  {'transport':<10} {'median img/s':>13}  {'rounds':<30}")
    for name, values in rates.items():
        print(f"  {name:<10} {med[name]:>13.0f}  {', '.join(f'{v:.0f}' for v in values):<30}")
    counted = f"  ({requests} HTTP range requests)" if requests is not None else ""
    print(f"  ratio http/native: {med['http'] / med['native']:.2f}x{counted}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rates": rates, "median": med, "ratio": med["http"] / med["native"],
                                               "range_requests": requests}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
