"""Shuffle quality and cost on class-sorted shards of ImageNet shape (issue 13's benchmark).

The set: 1,000 classes of 100 tiny JPEGs (16x16), packed in class order into 100 shards of
1,000 samples (an image-folder tree tarred as it lies). One shuffled epoch, batch 256, one rank.

Quality: mean distinct labels per full batch, against a uniform permutation's expectation
(1000 * (1 - prod_i (N - 100 - i) / (N - i)) = 226.2 for N = 100,000, batch 256). Target: the
global order within 5 % of it.

Cost: samples/s of an epoch (decode of a 16x16 JPEG, resize, normalize: the read path
dominates), medians of alternating rounds, page cache warm; and a cold pass after dropping
the shards from the page cache (``POSIX_FADV_DONTNEED``). Target: the global order within 5 %
of the native reader with the old buffer shuffle (DALI's, ``partition='shards'``). The old
mode is reached by setting the loader's ``data.partition`` (no user switch exists).

Over http (``--rows http``): the same shards served by ``tests/rangeserver.py`` on 127.0.0.1
in a process of its own. The block shuffle (``partition='block'``, the spec's
``shuffle.block``/``shuffle.window``; ``--block``/``--window`` add a row with other sizes)
against the stream transport's old windowed shuffle of the rank's range (``partition='shards'``,
windows of ``shuffle.buffer`` = 1,024 samples). Targets: quality at least 0.8 of a uniform
permutation's, samples/s within 10 % of the old windowed reading.

Usage: ``python benchmarks/shuffle.py [--rows local|http|all] [--classes 1000] [--per-class 100]
[--rounds 3] [--json out]``
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
import time
from datetime import date
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import feedfast  # noqa: E402
from feedfast import _env  # noqa: E402
from feedfast.spec.model import Spec  # noqa: E402

SPEC_BLOCK, SPEC_WINDOW = Spec.shuffle_block, Spec.shuffle_window  # the spec's defaults

SPEC = {"version": 1, "name": "shuffle-bench",
        "pipeline": {"image": ["decode", {"resize": {"size": [16, 16]}}, "normalize"], "label": ["label"]},
        "outputs": ["image", "label"], "batch": {"size": 256}, "seed": 0}


def class_sorted(out: Path, classes: int, per_class: int, per_shard: int) -> list[str]:
    """Tiny JPEGs in class order, ``per_shard`` to a shard (made once, kept in ``out``)."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    total = classes * per_class
    paths = [out / f"sorted-{i:05d}.tar" for i in range(-(-total // per_shard))]
    if all(p.exists() for p in paths):
        return [str(p) for p in paths]
    jpegs = []
    for c in range(16):
        buf = io.BytesIO()
        Image.new("RGB", (16, 16), (c * 15, 255 - c * 15, 128)).save(buf, format="JPEG")
        jpegs.append(buf.getvalue())
    for i, path in enumerate(paths):
        tmp = path.with_suffix(".tmp")
        with tarfile.open(tmp, "w") as tar:
            for n in range(i * per_shard, min(total, (i + 1) * per_shard)):
                label = n // per_class
                for ext, data in (("jpg", jpegs[label % 16]), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"s{n:07d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        tmp.rename(path)
    return [str(p) for p in paths]


def expected_distinct(classes: int, per_class: int, batch: int) -> float:
    """Mean distinct classes in a batch of a uniform permutation (sampling without replacement)."""
    total, absent = classes * per_class, 1.0
    for i in range(batch):
        absent *= (total - per_class - i) / (total - i)
    return classes * (1 - absent)


def epoch(shards: list[str], backend: str, partition: str, workers: int, block: tuple[int, int] | None = None,
          other_cpu: Callable[[], float] = lambda: 0.0) -> tuple[float, float, float]:
    """(samples/s, mean distinct labels per full batch, CPU ms per 1,000 samples) of one shuffled epoch.

    ``block``: (block, window) for the spec; the CPU time is this process's (all its threads) plus
    ``other_cpu()``'s (the range server's), from the first batch asked to the last: on a shared
    machine it moves less than the wall-clock rate.
    """
    spec = SPEC if block is None else {**SPEC, "shuffle": {"buffer": 1024, "shards": True, "block": block[0],
                                                           "window": block[1]}}
    loader = feedfast.DataLoader(spec, shards=shards, shuffle=True, backend=backend, num_workers=workers,
                                 device="cpu")
    if loader._partition != partition:
        loader.data.partition = partition  # the old shuffles for the comparison; users have no switch
    distinct, n = [], 0
    start, cpu = time.perf_counter(), time.process_time() + other_cpu()
    for _, labels in loader:
        n += int(labels.shape[0])
        if labels.shape[0] == SPEC["batch"]["size"]:
            distinct.append(len(set(labels.tolist())))
    rate = n / (time.perf_counter() - start)
    cpu_ms = (time.process_time() + other_cpu() - cpu) * 1e6 / n
    loader.close()
    return rate, statistics.mean(distinct), cpu_ms


def drop_cache(shards: list[str]) -> None:
    """Ask the kernel to drop the shards' pages (cold reads next)."""
    for s in shards:
        fd = os.open(s, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class Server:
    """``tests/rangeserver.py`` serving ``folder`` on 127.0.0.1, in a process of its own (not this one's GIL)."""

    def __init__(self, folder: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.rangeserver", str(folder)], cwd=HERE.parent,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            self.close()
            raise SystemExit(f"the range server did not start: {self.url!r}")

    def cpu(self) -> float:
        """CPU seconds the server process has used."""
        import psutil

        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def measure(rows: dict[str, tuple], rounds: int, workers: int, other_cpu: Callable[[], float] = lambda: 0.0,
            ) -> tuple[dict[str, list[float]], dict[str, float], dict[str, list[float]]]:
    """Samples/s, mean distinct labels and CPU ms per 1,000 samples of each row, rounds alternating the rows' order."""
    rates: dict[str, list[float]] = {k: [] for k in rows}
    cpus: dict[str, list[float]] = {k: [] for k in rows}
    quality: dict[str, float] = {}
    for r in range(rounds):
        for name in (list(rows) if r % 2 == 0 else list(reversed(rows))):
            shards, backend, partition, block = rows[name]
            rate, distinct, cpu = epoch(shards, backend, partition, workers, block, other_cpu)
            rates[name].append(rate)
            cpus[name].append(cpu)
            quality[name] = distinct
            print(f"round {r + 1} {name}: {rate:.0f} samples/s, {distinct:.1f} distinct labels per batch, "
                  f"{cpu:.0f} CPU ms per 1,000 samples", file=sys.stderr, flush=True)
    return rates, quality, cpus


def table(report: dict, base_row: str, rounds: int, want: float, where: str) -> list[str]:
    base = report["rows"][base_row]
    lines = [f"{report['date']}, {report['cores']} cores, {report['samples']} samples in class order, batch 256, "
             f"{where}, medians of {rounds} alternating rounds; uniform permutation: {want:.1f} distinct labels "
             "per batch", "", f"| shuffle | distinct labels / batch | of uniform | samples/s | vs {base_row} | "
             "CPU ms / 1,000 samples | vs | samples/s cold |", "|---|---|---|---|---|---|---|---|"]
    for name, row in report["rows"].items():
        cold_txt = f"{row['cold_samples_per_s']}" if row.get("cold_samples_per_s") is not None else "-"
        lines.append(f"| {name} | {row['distinct']} | {row['quality']:.2f} | {row['samples_per_s']} | "
                     f"{row['samples_per_s'] / base['samples_per_s']:.2f}x | {row['cpu_ms_per_1000']} | "
                     f"{row['cpu_ms_per_1000'] / base['cpu_ms_per_1000']:.2f}x | {cold_txt} |")
    return lines


def report_of(rates: dict[str, list[float]], quality: dict[str, float], cpus: dict[str, list[float]], want: float,
              samples: int, cold: dict[str, float] | None = None) -> dict:
    return {"date": date.today().isoformat(), "cores": os.cpu_count(), "samples": samples,
            "uniform_distinct": round(want, 1), "rows": {
                n: {"samples_per_s": round(statistics.median(rates[n])), "rounds": [round(x) for x in rates[n]],
                    "cpu_ms_per_1000": round(statistics.median(cpus[n])), "cpu_rounds": [round(x) for x in cpus[n]],
                    "distinct": round(quality[n], 1), "quality": round(quality[n] / want, 3),
                    "cold_samples_per_s": round(cold[n]) if cold and n in cold else None}
                for n in rates}}


def local_rows(shards: list[str], args: argparse.Namespace, want: float) -> tuple[dict, list[str]]:
    rows = {"threads, global order": (shards, "threads", "global", None),
            "dali, global order (feed)": (shards, "dali", "global", None),
            "dali, old: native reader + buffer shuffle": (shards, "dali", "shards", None),
            "threads, old: rank range shuffle": (shards, "threads", "shards", None)}
    rates, quality, cpus = measure(rows, args.rounds, args.workers)
    cold = {}
    for name in ("dali, global order (feed)", "dali, old: native reader + buffer shuffle", "threads, global order"):
        drop_cache(shards)
        cold[name] = epoch(*rows[name][:3], args.workers)[0]
    report = report_of(rates, quality, cpus, want, args.classes * args.per_class, cold)
    base_row = "dali, old: native reader + buffer shuffle"
    base, g = report["rows"][base_row], report["rows"]["dali, global order (feed)"]
    lines = table(report, base_row, args.rounds, want, "local shards, page cache warm")
    lines += ["", f"quality target (global order >= 0.95 of uniform): "
                  f"{'met' if min(report['rows'][n]['quality'] for n in rows if 'global' in n) >= 0.95 else 'not met'}",
              f"speed target (dali global order within 5% of the old native reader, warm): "
              f"{'met' if g['samples_per_s'] >= 0.95 * base['samples_per_s'] else 'not met'} "
              f"({g['samples_per_s'] / base['samples_per_s']:.2f}x)"]
    return report, lines


def http_rows(folder: Path, shards: list[str], args: argparse.Namespace, want: float) -> tuple[dict, list[str]]:
    server = Server(folder)
    try:
        urls = [f"{server.url}/{Path(s).name}" for s in shards]
        default = (SPEC_BLOCK, SPEC_WINDOW)
        rows = {f"http, block shuffle (block {default[0]}, window {default[1]})": (urls, "dali", "block", None),
                "http, old: windowed shuffle of the rank's range (1,024)": (urls, "dali", "shards", None)}
        if args.block:
            rows[f"http, block shuffle (block {args.block}, window {args.window})"] = (
                urls, "dali", "block", (args.block, args.window))
        rates, quality, cpus = measure(rows, args.rounds, args.workers, server.cpu)
    finally:
        server.close()
    report = report_of(rates, quality, cpus, want, args.classes * args.per_class)
    base_row = "http, old: windowed shuffle of the rank's range (1,024)"
    base = report["rows"][base_row]
    lines = table(report, base_row, args.rounds, want, "over http from 127.0.0.1")
    for name, row in report["rows"].items():
        if name == base_row:
            continue
        ratio = row["samples_per_s"] / base["samples_per_s"]
        cpu_ratio = row["cpu_ms_per_1000"] / base["cpu_ms_per_1000"]
        lines += [f"{name}: quality target (>= 0.8 of uniform) {'met' if row['quality'] >= 0.8 else 'not met'} "
                  f"({row['quality']:.2f}); speed target (within 10% of the old windowed reading) "
                  f"{'met' if ratio >= 0.9 else 'not met'} ({ratio:.2f}x samples/s, {cpu_ratio:.2f}x CPU per sample)"]
    return report, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", choices=("local", "http", "all"), default="all")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--block", type=int, default=0, help="over http, a row with this shuffle.block as well")
    ap.add_argument("--window", type=int, default=SPEC_WINDOW, help="that row's shuffle.window")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    out = _env.cache_dir() / f"class-sorted-{args.classes}-{args.per_class}-{args.per_shard}"
    t0 = time.perf_counter()
    shards = class_sorted(out, args.classes, args.per_class, args.per_shard)
    print(f"{len(shards)} class-sorted shards in {out} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    want = expected_distinct(args.classes, args.per_class, SPEC["batch"]["size"])
    reports, lines = {}, []
    if args.rows in ("local", "all"):
        reports["local"], part = local_rows(shards, args, want)
        lines += part
    if args.rows in ("http", "all"):
        reports["http"], part = http_rows(out, shards, args, want)
        lines += ([""] if lines else []) + part
    print("\n".join(lines))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(reports, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
