"""DALI's feed alone: a step's members read and handed over as DALI drives it, without a GPU.

Issue 36's CPU proxy. 32 shards x 256 JPEGs of about 55 KB (64 x 64 pixels carrying a comment segment:
the feed reads each one's frame header, not its pixels) plus a ``.cls``, warm page cache, the global
permutation of a shuffled epoch (``partition="global"``), batch 256. The feed
(:class:`feedfast.loader.backends.dali.feed.BatchFeeder`) is called step after step from this thread, as
DALI's executor calls it, and each TensorList it returns is held for ``DALI_HOLDS`` steps, as DALI holds
them; the images go to DALI with each sample's crop window and flip drawn for imagenet-train's
``random_resized_crop`` and ``flip`` (:mod:`feedfast.loader.backends.dali.draws`), the labels are taken as the
loader's producer takes them (:meth:`~feedfast.loader.backends.dali.feed.BatchFeeder.host`).

Measured, each a median of ``--rounds`` rounds, the packed path (the images handed to DALI as views of
the shards mapped read-only, no read and no copy; the labels one ``read_packed`` call a step, the GIL
released) and, in the same rounds, the member reader's path it replaced (Python per sample) as the
baseline:

- samples/s with one and with two reader threads, the consumer taking each step as soon as it can;
- the first step of a fresh epoch (a new feed over the next epoch's rows): milliseconds until
  its TensorLists are in hand;

Each run first takes ``WARM`` steps untimed (the shards mapped, the ring's slots written once).
- the consumer's wait when it takes a step every ``256 / --rate`` seconds (the rate a GPU
  decodes at; 24,791 images/s on one H200), over 4 epochs queued as the DALI backend queues them
  (the life pipeline's :class:`~feedfast.loader.backends.dali.life.StepQueue`, one ring shared, the next
  epoch's first steps read while this one's last are fed): p50 and p99 in ms;
- with ``--gil``: the GIL held a sample, from ``py-spy record --gil`` on a child process that
  runs the one-thread feed over 1 and then 4 epochs (see :func:`gil_per_sample`).

Usage::

    python benchmarks/feed.py [--rounds 5] [--steps 32] [--rate 24791] [--gil] [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARDS, PER_SHARD, MEAN_BYTES, BATCH = 32, 256, 55_000, 256
WARM = 11
"""Steps taken before the timed ones: the ring's slots each written once (a lifelong feed pays this once)."""


def make_set(folder: Path) -> list[str]:
    """The shards and their indexes, written once into ``folder``."""
    from feedfast.shards.index.tarindex import load_index

    folder.mkdir(parents=True, exist_ok=True)
    from dali_loader import padded_jpeg

    rng = np.random.default_rng(0)
    paths = []
    for s in range(SHARDS):
        path = folder / f"feed-jpeg-{s:04d}.tar"
        paths.append(str(path))
        if path.exists():
            continue
        tmp = path.with_suffix(".part")
        with tarfile.open(tmp, "w") as tar:
            for i in range(PER_SHARD):
                size = int(np.clip(rng.normal(MEAN_BYTES, MEAN_BYTES / 4), 8_000, 4 * MEAN_BYTES))
                image = padded_jpeg(s * PER_SHARD + i, size)
                for ext, payload in (("jpg", image), ("cls", str(int(rng.integers(1000))).encode())):
                    info = tarfile.TarInfo(f"{s:04d}_{i:05d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        os.replace(tmp, path)
    for path in paths:
        load_index(path, folder)
    return paths


def epoch_feed(paths: list[str], folder: Path, epoch: int, *, workers: int, packed: bool, ahead: int = 4,
               ring: Any = None, ring_base: int = 0) -> Any:
    """A feed over ``epoch``'s rows of the global permutation (rank 0 of 1)."""
    from functools import partial

    from feedfast.compile.build import build_plan
    from feedfast.compile.dali_draws import fed_draws
    from feedfast.loader.backends.dali.draws import StepDraws
    from feedfast.loader.backends.dali.feed import BatchFeeder
    from feedfast.order.deal import plan_epoch, step_positions
    from feedfast.order.draws import draws_key
    from feedfast.order.orders import epoch_rows
    from feedfast.shards.index.tarindex import load_index
    from feedfast.shards.transport.remote import Transfer
    from feedfast.sources.dataset import ShardSet
    from feedfast.spec.load import load_spec

    idx = tuple(str(load_index(p, folder)[0]) for p in paths)
    sset = ShardSet(tuple(paths), idx, (PER_SHARD,) * SHARDS, cache_dir=str(folder))
    ep = plan_epoch([PER_SHARD] * SHARDS, batch_size=BATCH, rank=0, world=1, last_batch="partial",
                    partition="global", seed=0, epoch=epoch)
    rows = epoch_rows(sset, [{"jpg"}, {"cls"}], ep, rank=0, world=1, seed=0, epoch=epoch, shuffle=True)
    fed = fed_draws(build_plan(load_spec("imagenet-train"), device="cpu"))
    feed = BatchFeeder(tuple(paths), ("file",) * SHARDS, rows,
                       partial(step_positions, batch_size=BATCH, count=len(rows)), steps=ep.steps,
                       cache=None, transfer=Transfer(), workers=workers, ahead=ahead, dali=[0],
                       draws=StepDraws(fed, draws_key(0, epoch)) if fed is not None else None, ring=ring,
                       ring_base=ring_base)
    if not packed:  # the member reader's path, as every step went before the packed read
        feed.packed, feed.ring = False, None
    return feed


def drive(feed: Any, steps: int, period: float = 0.0) -> tuple[float, list[float]]:
    """Call the feed for ``steps`` steps as DALI does (holding the last few), a step every ``period`` seconds at
    most; the seconds it took and each call's wait."""
    from feedfast.loader.backends.dali.feed import DALI_HOLDS

    held: deque[Any] = deque(maxlen=DALI_HOLDS)
    waits = []
    start = time.perf_counter()
    for step in range(steps):
        if period:
            due = start + step * period
            while time.perf_counter() < due:
                time.sleep(max(0.0, min(0.001, due - time.perf_counter())))
        t = time.perf_counter()
        held.append(feed(step))
        waits.append(time.perf_counter() - t)
        feed.host(step, 1)  # the labels, as the loader's producer takes them (they do not go through DALI)
    return time.perf_counter() - start, waits


def one_round(paths: list[str], folder: Path, steps: int, rate: float, epochs: int = 4) -> dict[str, float]:
    """One round of every measurement, both paths."""
    out: dict[str, float] = {}
    for packed in (True, False):
        name = "packed" if packed else "reader"
        for workers in (1, 2):
            feed = epoch_feed(paths, folder, 0, workers=workers, packed=packed)
            try:
                drive(feed, WARM)  # the pool started, every ring slot written once (a loader's first steps)
                seconds, _ = drive(_From(feed, WARM), steps)
            finally:
                feed.close()
            out[f"{name}_{workers}t_samples_s"] = steps * BATCH / seconds
        feed = epoch_feed(paths, folder, 1, workers=2, packed=packed)
        t = time.perf_counter()
        feed(0)
        out[f"{name}_first_step_ms"] = (time.perf_counter() - t) * 1e3
        feed.close()
        queue = queued_epochs(paths, folder, epochs, workers=2, packed=packed)
        try:
            drive(queue, WARM)
            _, waits = drive(_From(queue, WARM), epochs * SHARDS * PER_SHARD // BATCH - WARM, period=BATCH / rate)
        finally:
            queue.close()
        out[f"{name}_wait_p50_ms"] = float(np.percentile(waits, 50)) * 1e3
        out[f"{name}_wait_p99_ms"] = float(np.percentile(waits, 99)) * 1e3
    return out


def queued_epochs(paths: list[str], folder: Path, epochs: int, *, workers: int, packed: bool) -> Any:
    """The life pipeline's source (:class:`~feedfast.loader.backends.dali.life.StepQueue`) holding epochs 1 ..
    ``epochs``, their feeds sharing one ring, as the DALI backend queues them: an epoch's first steps are read
    while the one before's last are fed."""
    from feedfast.loader.backends.dali.feed import DALI_HOLDS
    from feedfast.loader.backends.dali.life import StepQueue

    queue = _Queue(StepQueue(None, holds=DALI_HOLDS))
    steps = SHARDS * PER_SHARD // BATCH
    for epoch in range(1, epochs + 1):
        queue.queue.add(epoch, None, lambda base, e=epoch: _Stream(epoch_feed(
            paths, folder, e, workers=workers, packed=packed, ring=queue.queue.ring, ring_base=base)), 0, steps)
    return queue


class _Stream:
    """What the step queue needs of an epoch's stream: its feed."""

    def __init__(self, feeder: Any) -> None:
        self.feeder = feeder


class _Queue:
    """A step queue driven as a feed: iteration -> the step's TensorLists; ``host`` the labels of the step fed at that
    iteration."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def __call__(self, iteration: int) -> Any:
        return self.queue(iteration)

    def host(self, iteration: int, component: int) -> Any:
        tag = self.queue.tags.pop(iteration)
        return self.queue.segments[tag.segment].stream.feeder.host(tag.step, component)

    def close(self) -> None:
        self.queue.close()


class _From:
    """A feed called from step ``first`` on (step 0 was taken already)."""

    def __init__(self, feed: Any, first: int) -> None:
        self.feed, self.first = feed, first

    def __call__(self, step: int) -> Any:
        return self.feed(step + self.first)

    def host(self, step: int, component: int) -> Any:
        return self.feed.host(step + self.first, component)


def gil_per_sample(folder: Path, epochs: int = 4) -> float | None:
    """Microseconds a sample the GIL is held by the feed, from ``py-spy record --gil`` on a child process running
    the one-thread packed feed over ``epochs`` epochs: py-spy keeps a thread's stack only while it holds the GIL;
    counted are the feed's reader threads and the driving thread's calls into the feed (not the imports, nor
    this script's own opening of the shards each epoch, nor the first import of DALI in a reader thread)."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        print("py-spy is not installed: pip install py-spy (the GIL figure is left out)")
        return None
    rate = 1000
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "gil.txt"
        cmd = [str(spy), "record", "--nonblocking", "--gil", "--threads", "--rate", str(rate), "--format", "raw", "-o", str(raw),
               "--", sys.executable, __file__, "--child", str(folder), "--epochs", str(epochs)]
        subprocess.run(cmd, check=True, capture_output=True)
        held = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            thread = stack.split(";", 1)[0]
            if ("feedfast-feed" in thread or "drive (" in stack) and "_find_and_load" not in stack:
                held += int(count)
    return held / rate / (epochs * SHARDS * PER_SHARD) * 1e6


def child(folder: Path, epochs: int) -> None:
    """The loop py-spy watches: ``epochs`` whole epochs of the packed feed at one reader thread."""
    paths = make_set(folder)
    for epoch in range(epochs):
        feed = epoch_feed(paths, folder, epoch, workers=1, packed=True)
        drive(feed, SHARDS * PER_SHARD // BATCH)
        feed.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=32 - WARM, help="steps timed a run (the epoch holds 32)")
    parser.add_argument("--rate", type=float, default=24_791.0, help="images/s the consumer takes (a GPU's)")
    parser.add_argument("--gil", action="store_true", help="also the GIL a sample, with py-spy")
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.epochs)
        return
    from feedfast._env import cache_dir

    folder = args.folder or cache_dir() / "bench-feed"
    paths = make_set(folder)
    for path in paths:  # warm page cache
        Path(path).read_bytes()
    rounds = [one_round(paths, folder, args.steps, args.rate) for _ in range(args.rounds)]
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    for r in rounds:
        r["packed_2t_over_1t"] = r["packed_2t_samples_s"] / r["packed_1t_samples_s"]
        r["packed_over_reader_1t"] = r["packed_1t_samples_s"] / r["reader_1t_samples_s"]
    median["packed_2t_over_1t"] = statistics.median(r["packed_2t_over_1t"] for r in rounds)
    median["packed_over_reader_1t"] = statistics.median(r["packed_over_reader_1t"] for r in rounds)
    if args.gil:
        median["packed_gil_us_per_sample"] = gil_per_sample(folder) or float("nan")
    print(f"DALI's feed, {SHARDS} shards x {PER_SHARD} members of ~{MEAN_BYTES // 1000} KB + .cls, batch {BATCH}, "
          f"the global order; medians of {args.rounds} rounds")
    for key, value in median.items():
        print(f"  {key:32s} {value:12,.2f}")
    if args.json:
        args.json.write_text(json.dumps({"median": median, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
