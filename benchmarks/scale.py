"""feedfast's own bookkeeping at ImageNet's shape (issue 22's benchmark).

The set: 1,024 shards x 1,251 samples (1,281,024, ImageNet's train split) of tiny payloads:
each sample an 8x8 JPEG (``.jpg``, one of four variants made once with PIL) and its label
(``.cls``, ``n % 1000`` in ASCII). The tars are written here with hand-made ustar headers (one
shard is read back with :mod:`tarfile` as a check) into a cache folder, once, and reused.
Decoding an 8x8 JPEG costs next to nothing, so what is measured is feedfast's bookkeeping:
indexes, image checks, the epoch plan, per-sample objects.

Every figure is taken in a fresh process (this script re-invoked with ``--child``), with
``FEEDFAST_CACHE`` set to the benchmark's own folder. The loader: the spec below (decode, resize
to 8x8, normalize; batch 256), ``shuffle=True``, ``device="cpu"``, the default backend.

- cold: with every ``.idx`` beside the shards and the cache removed, ``feedfast shards index``
  alone; then (removed again) the loader's construction and first batch. Page cache left warm.
- warm (indexes cached), at 1 rank and as rank 3 of 8 (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
  ``LOCAL_WORLD_SIZE`` in the child's environment): construction, first batch, memory above
  the loader's imports (``feedfast``, torch, PIL and the threaded path's modules) after it (USS, PSS, RSS from psutil, and the peak RSS), the size of
  ``state_dict()`` as JSON; the rest of the epoch drained, then the next epoch's first batch
  (the training loop's case: the loader starts it ahead); then, after breaking out of that
  epoch after its first batch, ``set_epoch`` and the first batch of another (the case of a
  loop that stops an epoch early: nothing is started ahead).

Wall and CPU seconds (this process's threads, its waited-for and its live child processes).
On a shared machine CPU seconds are the steady figure.

Targets (issue 22's "Done when", at 1,281,024 samples): warm construction to first batch under
1 s at 1 rank and at 8; the next epoch's first batch under 0.1 s; memory above the import per
rank under 32 MB (USS: beyond a shared mapped index); cold indexing at least 4x faster than the
issue's 476 s (``feedfast shards index``: 98 s), these two scaled linearly to other sizes.

Usage::

    python benchmarks/scale.py [--quarter | --shards N --per-shard M] [--data DIR] [--cache DIR]
                               [--skip-cold] [--timeout 900] [--json PATH]

``--quarter``: 256 shards x 1,251 (``make bench``'s size); the default is full size. The set
goes to ``bench-results/scale-data/{full,quarter,NxM}`` unless ``--data``; the cache to
``bench-results/scale-cache/<the data folder's name>`` unless ``--cache``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # children import feedfast from this checkout
RESULTS = ROOT / "bench-results"

FULL, QUARTER = (1024, 1251), (256, 1251)
BATCH = 256
SPEC = {"version": 1, "name": "scale",
        "pipeline": {"image": ["decode", {"resize": {"size": [8, 8]}}, "normalize"], "label": ["label"]},
        "outputs": ["image", "label"], "batch": {"size": BATCH}, "seed": 0}
DATA_FORMAT = 1  # bump when the written set changes, so an old cache folder is rewritten

BASE_SAMPLES = 1_281_024  # issue 22's figures: today's cold start at this size
BASE_COLD_S, BASE_CLI_S, SPEEDUP = 476.0, 98.0, 4.0
FIRST_BATCH_S, NEXT_EPOCH_S, MEMORY_MB = 1.0, 0.1, 32.0
MB = 1e6
WORLD, RANK_OF_WORLD = 8, 3
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
MARK = "@scale "  # a child's figure lines start with this


@dataclass(frozen=True)
class Layout:
    """Where the set and the benchmark's feedfast cache live, and the set's size."""

    data: Path
    cache: Path
    shards: int
    per_shard: int

    @property
    def samples(self) -> int:
        return self.shards * self.per_shard

    @property
    def width(self) -> int:
        return max(4, len(str(self.shards - 1)))

    def shard(self, i: int) -> Path:
        return self.data / f"scale-{i:0{self.width}d}.tar"

    @property
    def pattern(self) -> str:
        """A brace pattern naming every shard (what a user passes)."""
        return str(self.data / f"scale-{{{0:0{self.width}d}..{self.shards - 1:0{self.width}d}}}.tar")

    def args(self) -> list[str]:
        return ["--data", str(self.data), "--cache", str(self.cache), "--shards", str(self.shards),
                "--per-shard", str(self.per_shard)]


# ---- the set -------------------------------------------------------------------------------------------------

BLOCK = 512
MTIME = 1_700_000_000


def tiny_jpegs() -> list[bytes]:
    """Four 8x8 JPEGs of different colours."""
    from PIL import Image

    out = []
    for c in range(4):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (c * 60, 255 - c * 60, 128)).save(buf, format="JPEG")
        out.append(buf.getvalue())
    return out


@cache
def _template(size: int) -> tuple[bytes, int]:
    """A ustar header of a regular file of ``size`` bytes with an empty name, and its byte sum (checksum spaces)."""
    h = bytearray(BLOCK)
    h[100:108] = b"0000644\0"
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % MTIME
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:265] = b"ustar\x0000"
    return bytes(h), sum(h)


def _member(name: bytes, data: bytes) -> tuple[bytes, bytes]:
    """A member's header and its data padded to the block."""
    template, base = _template(len(data))
    header = name + template[len(name):148] + b"%06o\0 " % (base + sum(name)) + template[156:]
    return header, data + b"\0" * (-len(data) % BLOCK)


def write_shard(path: Path, first: int, count: int, jpegs: list[bytes]) -> None:
    """Samples ``first`` .. ``first + count - 1`` as one tar, written whole and renamed into place."""
    parts: list[bytes] = []
    for n in range(first, first + count):
        key = b"s%08d" % n
        parts += _member(key + b".jpg", jpegs[n % len(jpegs)])
        parts += _member(key + b".cls", b"%d" % (n % 1000))
    parts.append(b"\0" * (2 * BLOCK))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"".join(parts))
    os.replace(tmp, path)


def make_set(layout: Layout) -> bool:
    """Write the set unless its folder already holds it (then reused); True when written."""
    marker = layout.data / "scale.json"
    want = {"format": DATA_FORMAT, "shards": layout.shards, "per_shard": layout.per_shard}
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return False
    layout.data.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    for old in [*layout.data.glob("scale-*.tar"), *layout.data.glob("scale-*.idx")]:
        old.unlink()
    jpegs = tiny_jpegs()
    for i in range(layout.shards):
        write_shard(layout.shard(i), i * layout.per_shard, layout.per_shard, jpegs)
        if (i + 1) % 128 == 0:
            log(f"  wrote {i + 1} of {layout.shards} shards")
    marker.write_text(json.dumps(want))
    return True


def check_set(layout: Layout) -> None:
    """Read the last shard back with :mod:`tarfile`: names, sizes, JPEGs that decode to 8x8, labels."""
    from PIL import Image

    last = layout.shards - 1
    with tarfile.open(layout.shard(last)) as tar:
        members = tar.getmembers()
        if len(members) != 2 * layout.per_shard:
            raise SystemExit(f"{layout.shard(last)}: {len(members)} members, not {2 * layout.per_shard}")
        first = last * layout.per_shard
        for j in (0, len(members) - 2):
            n = first + j // 2
            jpg, cls = members[j], members[j + 1]
            assert (jpg.name, cls.name) == (f"s{n:08d}.jpg", f"s{n:08d}.cls"), (jpg.name, cls.name)
            image = Image.open(io.BytesIO(tar.extractfile(jpg).read()))  # type: ignore[union-attr]
            assert image.size == (8, 8), image.size
            assert tar.extractfile(cls).read() == str(n % 1000).encode()  # type: ignore[union-attr]


def clear_indexes(layout: Layout) -> None:
    """Remove every index beside the shards and the benchmark's feedfast cache (a cold start next)."""
    for idx in layout.data.glob("scale-*.idx"):
        idx.unlink()
    shutil.rmtree(layout.cache, ignore_errors=True)


# ---- the children (one figure set each, in a fresh process) --------------------------------------------------

T0 = time.perf_counter()


def emit(**figures: Any) -> None:
    """One JSON line of figures for the parent (with seconds since this process started)."""
    print(MARK + json.dumps({**figures, "t": round(time.perf_counter() - T0, 3)}), flush=True)


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads), of its waited-for children and of its live ones."""
    import psutil

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Emit ``{name}_wall`` and ``{name}_cpu``: the seconds the block took."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    yield
    emit(**{f"{name}_wall": round(time.perf_counter() - wall, 4), f"{name}_cpu": round(cpu_seconds() - cpu, 4)})


def memory() -> dict[str, float]:
    """This process's USS, PSS and RSS, and its peak RSS so far, in bytes."""
    import psutil

    m = psutil.Process().memory_full_info()
    return {"uss": m.uss, "pss": m.pss, "rss": m.rss, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def make_loader(layout: Layout) -> Any:
    import feedfast

    return feedfast.DataLoader(SPEC, shards=layout.pattern, batch_size=BATCH, shuffle=True, device="cpu")


def child_cold(layout: Layout) -> None:
    """Construction and first batch with no index and no cache (the parent removed them)."""
    import torch  # noqa: F401

    import feedfast  # noqa: F401

    with timed("construct"):
        loader = make_loader(layout)
    with timed("first"):
        next(iter(loader))
    loader.close()


def child_warmup(layout: Layout) -> None:
    """A construction that indexes and checks what is missing (with ``--skip-cold``), not a figure."""
    with timed("warmup"):
        make_loader(layout).close()


def child_warm(layout: Layout) -> None:
    """Construction, first batch, memory and state; the next epoch after a full one; another after a break."""
    import PIL.Image  # noqa: F401
    import torch  # noqa: F401

    import feedfast  # noqa: F401
    import feedfast.loader.backends.cpu.threads  # noqa: F401  the threaded path's modules: the loader imports them
    import feedfast.loader.dataloader  # noqa: F401  imported by feedfast.DataLoader's first use, not by feedfast

    base = memory()
    emit(import_s=round(time.perf_counter() - T0, 3), base_rss=base["rss"])
    with timed("construct"):
        loader = make_loader(layout)
    with timed("first"):
        it = iter(loader)
        next(it)
    now = memory()
    emit(**{f"mem_{k}": now[k] - (base["rss"] if k == "peak" else base[k]) for k in now},
         state_bytes=len(json.dumps(loader.state_dict()).encode()), steps=len(loader))
    with timed("drain"):
        for _ in it:
            pass
    with timed("next_epoch"):  # the loop's `for batch in loader` after a complete epoch
        it = iter(loader)
        next(it)
    it.close()  # a `break` out of the epoch after its first batch
    with timed("restart"):
        loader.set_epoch(loader.epoch + 1)
        next(iter(loader))
    loader.close()


CHILDREN: dict[str, Callable[[Layout], None]] = {"cold": child_cold, "warmup": child_warmup, "warm": child_warm}
CHILD_FIGURES = {"cold": ["construct", "first"], "warmup": ["warmup"], "cli": ["index"],
                 "warm": ["construct", "first", "mem_uss", "drain", "next_epoch", "restart"]}


# ---- the parent ----------------------------------------------------------------------------------------------

def log(text: str) -> None:
    print(f"[scale] {text}", file=sys.stderr, flush=True)


@dataclass
class Run:
    """A child's figures, its own wall and CPU seconds, and how it ended."""

    figures: dict[str, Any] = field(default_factory=dict)
    wall: float = 0.0
    cpu: float = 0.0
    killed: bool = False
    rc: int = 0
    last_t: float = 0.0


def _waited_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_child(cmd: list[str], env: dict[str, str], timeout: float) -> Run:
    """Run ``cmd`` in a session of its own, killed with its process group after ``timeout`` seconds."""
    wall, cpu = time.perf_counter(), _waited_cpu()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    run = Run()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        run.killed = True
    run.wall, run.cpu, run.rc = time.perf_counter() - wall, _waited_cpu() - cpu, proc.returncode
    for line in out.splitlines():
        if line.startswith(MARK):
            run.figures.update(json.loads(line[len(MARK):]))
    run.last_t = float(run.figures.pop("t", 0.0))
    if run.rc and not run.killed:
        log(f"{cmd[-1] if cmd else ''} exited {run.rc}; its stderr ends:\n" + "\n".join(err.splitlines()[-15:]))
    return run


def child_env(layout: Layout, rank: int | None) -> dict[str, str]:
    """The environment of a child: the benchmark's cache, this checkout first, and a rank of 8 or none."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env["FEEDFAST_CACHE"] = str(layout.cache)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if rank is not None:
        env.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    return env


def child(what: str, layout: Layout, timeout: float, rank: int | None = None) -> Run:
    where = f" as rank {rank} of {WORLD}" if rank is not None else ""
    log(f"{what}{where} ...")
    run = run_child([sys.executable, str(Path(__file__).resolve()), *layout.args(), "--child", what],
                    child_env(layout, rank), timeout)
    log(f"{what}{where}: {run.wall:.1f} s wall, {run.cpu:.1f} s CPU{' (killed)' if run.killed else ''}")
    return run


def cli_index(layout: Layout, timeout: float) -> Run:
    """``feedfast shards index PATTERN`` from cold, timed as a whole process."""
    clear_indexes(layout)
    log("feedfast shards index (cold) ...")
    run = run_child([sys.executable, "-m", "feedfast", "shards", "index", layout.pattern],
                    child_env(layout, None), timeout)
    run.figures = {} if run.killed or run.rc else {"index_wall": run.wall, "index_cpu": run.cpu}
    log(f"feedfast shards index: {run.wall:.1f} s wall, {run.cpu:.1f} s CPU{' (killed)' if run.killed else ''}")
    return run


def sections(layout: Layout, args: argparse.Namespace) -> tuple[dict[str, Run], dict[str, float]]:
    """Every child's run, by name, and each section's seconds."""
    runs: dict[str, Run] = {}
    took: dict[str, float] = {}
    start = time.perf_counter()
    if not args.skip_cold:
        runs["cli"] = cli_index(layout, args.timeout)
        clear_indexes(layout)
        runs["cold"] = child("cold", layout, args.timeout)
        took["cold"] = time.perf_counter() - start
    else:
        runs["warmup"] = child("warmup", layout, args.timeout)
        took["warmup"] = time.perf_counter() - start
    for name, rank in (("warm1", None), ("warm8", RANK_OF_WORLD)):
        start = time.perf_counter()
        runs[name] = child("warm", layout, args.timeout, rank)
        took[name] = time.perf_counter() - start
    return runs, took


# ---- the report ----------------------------------------------------------------------------------------------

def _missing(run: Run, what: str, key: str, timeout: float) -> str:
    """Why a figure is missing: the child ran out of time (on this figure or before it) or failed."""
    if not run.killed:
        return f"failed (exit {run.rc})"
    order = CHILD_FIGURES[what]
    pending = [k for k in order if not any(f.startswith(k) for f in run.figures)]
    if pending and key.startswith(pending[0]):
        return f"over {timeout - run.last_t:.0f} s (child killed at {timeout:.0f} s)"
    return "not reached"


def seconds(run: Run | None, what: str, keys: list[str], samples: int, timeout: float) -> tuple[str, float | None]:
    """'W s wall, C s CPU (U us CPU/sample)' of the sum of ``keys``' figures, and the wall seconds."""
    if run is None:
        return "skipped", None
    try:
        wall = sum(run.figures[f"{k}_wall"] for k in keys)
        cpu = sum(run.figures[f"{k}_cpu"] for k in keys)
    except KeyError:
        gone = next(k for k in keys if f"{k}_wall" not in run.figures)
        return _missing(run, what, gone, timeout), None
    return f"{num(wall)} s wall, {num(cpu)} s CPU ({num(cpu * 1e6 / samples)} us CPU/sample)", wall


def mem_text(run: Run | None, timeout: float) -> tuple[str, float | None]:
    if run is None:
        return "skipped", None
    if "mem_uss" not in run.figures:
        return _missing(run, "warm", "mem_uss", timeout), None
    f = run.figures
    return (f"USS +{f['mem_uss'] / MB:.0f} MB, PSS +{f['mem_pss'] / MB:.0f} MB, RSS +{f['mem_rss'] / MB:.0f} MB "
            f"(peak RSS +{f['mem_peak'] / MB:.0f} MB)"), f["mem_uss"] / MB


def num(x: float) -> str:
    """Three significant digits, without an exponent."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def verdict(value: float | None, limit: float) -> str:
    return "-" if value is None else ("met" if value < limit else "not met")


def table(runs: dict[str, Run], layout: Layout, timeout: float) -> list[list[str]]:
    """Rows of (figure, measured, target, verdict)."""
    n, scale = layout.samples, layout.samples / BASE_SAMPLES
    get = runs.get
    cold_s, cli_s = BASE_COLD_S * scale / SPEEDUP, BASE_CLI_S * scale / SPEEDUP
    rows: list[list[str]] = []

    def add(figure: str, measured: tuple[str, float | None], target: str, limit: float | None) -> None:
        rows.append([figure, measured[0], target, "-" if limit is None else verdict(measured[1], limit)])

    where = f"476 s x {scale:.3g} / 4" if scale != 1 else "476 s / 4"
    add("cold: construction + first batch", seconds(get("cold"), "cold", ["construct", "first"], n, timeout),
        f"<= {cold_s:.3g} s ({where})", cold_s)
    add("cold: `feedfast shards index`", seconds(get("cli"), "cli", ["index"], n, timeout),
        f"<= {cli_s:.3g} s ({'98 s' if scale == 1 else f'98 s x {scale:.3g}'} / 4)", cli_s)
    for name, who in (("warm1", "1 rank"), ("warm8", f"rank {RANK_OF_WORLD} of {WORLD}")):
        run = get(name)
        add(f"warm construction, {who}", seconds(run, "warm", ["construct"], n, timeout), "(part of the next)", None)
        add(f"warm construction to first batch, {who}", seconds(run, "warm", ["construct", "first"], n, timeout),
            "< 1 s", FIRST_BATCH_S)
        add(f"next epoch's first batch (after a full epoch), {who}",
            seconds(run, "warm", ["next_epoch"], n, timeout), "< 0.1 s", NEXT_EPOCH_S)
        add(f"first batch after set_epoch (a broken-off epoch), {who}",
            seconds(run, "warm", ["restart"], n, timeout), "< 0.1 s", NEXT_EPOCH_S)
        add(f"memory above the loader's imports after the first batch, {who}", mem_text(run, timeout), "USS < 32 MB",
            MEMORY_MB)
        if run is not None and "state_bytes" in run.figures:
            add(f"state_dict() as JSON, {who}", (f"{run.figures['state_bytes']} B", None), "O(1)", None)
        if run is not None and "drain_wall" in run.figures:
            read = (run.figures["steps"] - 1) * BATCH  # CPU per sample read, here
            add(f"rest of the epoch ({run.figures['steps'] - 1} batches; per sample read), {who}",
                seconds(run, "warm", ["drain"], read, timeout), "(not a target)", None)
    return rows


def commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" (feedfast/ modified)" if git("status", "--porcelain", "--", "feedfast") else "")


def report(rows: list[list[str]], layout: Layout, took: dict[str, float]) -> list[str]:
    lines = [f"{date.today().isoformat()}, commit {commit()}, {os.cpu_count()} cores, {layout.shards} shards x "
             f"{layout.per_shard} samples ({layout.samples:,}), batch {BATCH}, threaded path, device cpu; targets "
             f"for {BASE_SAMPLES:,} samples (cold's scaled by samples); us CPU per sample of the set", "",
             "| figure | measured | target | |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    lines += ["", "sections: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items())]
    return lines


# ---- main ----------------------------------------------------------------------------------------------------

def layout_of(args: argparse.Namespace) -> Layout:
    shards, per = QUARTER if args.quarter else FULL
    shards, per = args.shards or shards, args.per_shard or per
    name = {QUARTER: "quarter", FULL: "full"}.get((shards, per), f"{shards}x{per}")
    data = Path(args.data) if args.data else RESULTS / "scale-data" / name
    cache = Path(args.cache) if args.cache else RESULTS / "scale-cache" / data.name
    return Layout(data.resolve(), cache.resolve(), shards, per)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quarter", action="store_true", help="256 shards x 1,251 samples (make bench's size)")
    p.add_argument("--shards", type=int, help="shards (default 1,024, or 256 with --quarter)")
    p.add_argument("--per-shard", type=int, help="samples per shard (default 1,251)")
    p.add_argument("--data", help="the set's folder (default bench-results/scale-data/{full,quarter,NxM})")
    p.add_argument("--cache", help="FEEDFAST_CACHE of every child (default bench-results/scale-cache/<data's name>)")
    p.add_argument("--skip-cold", action="store_true", help="no cold section (476 s at full size today)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a child is killed (default 900)")
    p.add_argument("--json", help="write the figures here too")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    layout = layout_of(args)
    if args.child:
        CHILDREN[args.child](layout)
        return 0
    start = time.perf_counter()
    log(f"set: {layout.shards} x {layout.per_shard} in {layout.data}")
    wrote = make_set(layout)
    check_set(layout)
    set_s = time.perf_counter() - start
    log(f"set {'written' if wrote else 'reused'} and checked in {set_s:.1f} s")
    runs, took = sections(layout, args)
    rows = table(runs, layout, args.timeout)
    print("\n".join(report(rows, layout, {"set": set_s, **took})))
    if args.json:
        out = {"date": date.today().isoformat(), "commit": commit(), "shards": layout.shards,
               "per_shard": layout.per_shard, "samples": layout.samples, "set_written": wrote,
               "sections_s": {"set": set_s, **took}, "table": rows,
               "runs": {k: {"figures": r.figures, "wall": r.wall, "cpu": r.cpu, "killed": r.killed, "rc": r.rc}
                        for k, r in runs.items()}}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
