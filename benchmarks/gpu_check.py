"""One check of feedfast on a machine with an NVIDIA GPU; ``--dry-run`` checks the plumbing on a CPU.

Usage::

    python benchmarks/gpu_check.py [--wheels DIR] [--dry-run] [--json out.json] [--budget 450]
                                   [--samples N] [--only SECTION,...] [--target DIR]

Sections, in order. Each is independent: a failure is recorded as ``error: <one line>`` (with
the traceback on stderr) and the next section runs.

==================  ===========================================================================
``setup``           DALI, webdataset, braceexpand, PyYAML, psutil, numpy and PIL import; when one
                    does not and a wheel folder is given (``--wheels`` or ``$WHEELS``), every
                    wheel there is installed with ``pip install --no-index --no-deps --target``
                    (pieces ``NAME.part-*`` are joined first and a joined ``.tar`` unpacked)
                    and the target folder is put on ``sys.path``.
``dataset``         the demo dataset (``demo_shards``), or ``--samples N`` photo-like JPEGs.
``loader_gpu``      imagenet-train images/s, GPU-placed (``mixed`` nvJPEG decode) to ``cuda``.
``loader_cpu_cuda`` the same CPU-placed, delivered to ``cuda`` (pinned ring, uint8 transfer).
``loader_cpu_cpu``  the same CPU-placed, delivered to the CPU.
``stall``           StallMeter's CUDA-event stall against an injected one: a loader sleeping S
                    ms per batch while each step enqueues T ms of calibrated GPU matmuls, so the
                    GPU idles max(0, S - T) of every S ms step (S=20, T=10: 0.5; S=5, T=10: 0).
``nvml``            the meter's NVML figures (gpu_util, gpu_mem_mb) under a GPU-bound loop.
``train_feedfast``  ResNet-50 (bf16 autocast, channels_last, SGD) fed by feedfast (GPU-placed).
``train_torch``     the same fed by the torchvision recipe (``make_torch_loader``).
==================  ===========================================================================

Without CUDA (or with ``--dry-run``) everything that can runs on the CPU at tiny sizes: 64 px
crops, a few batches, a small dataset, a tiny model when torchvision is missing, the meter's
clock-backed GPU stand-in (``SimulatedGpu``) for the stall check; sections that need a GPU
say ``skipped: no CUDA (dry run)``.

One table (what, figure, unit, note) is printed at the end; ``--json`` writes everything.
A time budget (``--budget``, default 450 s) skips the sections left when it runs out.
Exit status: 0 when every section ran (a dry run's GPU-only skips included), 1 when any
section errored or was cut by the budget, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
import zipfile
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's feedfast, pip-installed or not
    sys.path.insert(0, str(REPO))

T = TypeVar("T")
REQUIRED = ("nvidia.dali", "webdataset", "braceexpand", "yaml", "psutil", "numpy", "PIL")
"""Modules feedfast needs here; a missing one triggers the wheel install."""
SPEC = REPO / "pipelines" / "imagenet-train.yaml"
TOLERANCE = 0.05
"""Largest accepted gap between the measured and the expected stall fraction."""


# ---------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Sizes:
    """How much each section measures."""

    batch: int
    image: int | None  # crop size override; None keeps the spec's 224
    warmup: int
    batches: int
    stall_steps: int
    nvml_seconds: float
    train_warmup: int
    train_steps: int
    samples: int | None  # None: the demo dataset (1,024 samples)
    small_images: bool


GPU_SIZES = Sizes(batch=64, image=None, warmup=5, batches=50, stall_steps=30, nvml_seconds=3.0,
                  train_warmup=5, train_steps=30, samples=None, small_images=False)
DRY_SIZES = Sizes(batch=16, image=64, warmup=1, batches=4, stall_steps=10, nvml_seconds=0.5,
                  train_warmup=1, train_steps=3, samples=128, small_images=True)


@dataclass
class Context:
    """What sections share: settings, the clock budget, and what earlier sections made."""

    sizes: Sizes
    dry: bool
    cuda: bool  # CUDA is used (present and not a --dry-run)
    cuda_present: bool
    budget: Budget
    wheels: Path | None
    target: Path | None
    shards: str | None = None
    shard_paths: list[str] = field(default_factory=list)
    samples: int = 0

    @property
    def overrides(self) -> list[str]:
        """Spec overrides for the crop size (none at full size)."""
        return [f"pipeline.image[1].size={self.sizes.image}"] if self.sizes.image else []

    @property
    def device(self) -> torch.device:
        """Where models and measured work run."""
        return torch.device("cuda" if self.cuda else "cpu")


class Skip(Exception):
    """A section cannot run here (no CUDA in a dry run, NVML absent); not an error."""


class OverBudget(Exception):
    """The time budget ran out before or during a section."""


class CheckFailed(Exception):
    """A figure was measured but is not what the check expects."""


class Budget:
    """A wall-clock allowance for the whole run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start

    def check(self) -> None:
        """Raise :class:`OverBudget` once the allowance is spent."""
        if self.elapsed() > self.seconds:
            raise OverBudget(f"time budget of {self.seconds:g} s spent after {self.elapsed():.0f} s")


# ---------------------------------------------------------------------------- results
@dataclass
class Row:
    """One line of the final table."""

    what: str
    figure: float | str | None
    unit: str = ""
    note: str = ""


@dataclass
class Section:
    """A section's outcome: ``ok``, ``skipped``, ``error`` or ``over-budget``, its rows and data."""

    name: str
    title: str
    status: str = "ok"
    note: str = ""
    seconds: float = 0.0
    rows: list[Row] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def add(self, what: str, figure: float | str | None, unit: str = "", note: str = "") -> None:
        """Append a table row."""
        self.rows.append(Row(what, figure, unit, note))


def say(message: str) -> None:
    """Progress on stderr (the table goes to stdout at the end)."""
    print(f"[gpu-check] {message}", file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    """An exception as ``Type: first line``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


# ---------------------------------------------------------------------------- setup: wheels
def probe(names: Sequence[str]) -> dict[str, str]:
    """Import each module; map the ones that fail to ``Type: message``."""
    failed: dict[str, str] = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - DALI can raise OSError/RuntimeError for a missing library
            failed[name] = one_line(exc)
    return failed


def join_pieces(folder: Path) -> list[str]:
    """Join ``NAME.part-*`` pieces into ``NAME`` (sorted order); unpack the wheels of a joined tar."""
    done: list[str] = []
    groups: dict[str, list[Path]] = {}
    for piece in sorted(folder.glob("*.part-*")):
        groups.setdefault(piece.name.split(".part-")[0], []).append(piece)
    for name, pieces in groups.items():
        whole = folder / name
        size = sum(p.stat().st_size for p in pieces)
        if not whole.exists() or whole.stat().st_size != size:
            with whole.open("wb") as out:
                for piece in pieces:
                    with piece.open("rb") as src:
                        shutil.copyfileobj(src, out, 1 << 24)
        done.append(f"joined {len(pieces)} pieces into {name} ({size / 2**20:.0f} MiB)")
        if tarfile.is_tarfile(whole):
            done.append(f"unpacked {unpack_wheels(whole, folder)} wheels from {name}")
    return done


def unpack_wheels(archive: Path, folder: Path) -> int:
    """Write the ``.whl`` members of a tar into ``folder`` by base name; return how many."""
    count = 0
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = os.path.basename(member.name)
            if member.isfile() and name.endswith(".whl"):
                src = tar.extractfile(member)
                if src is None:
                    raise RuntimeError(f"{archive}: cannot read {member.name}")
                with src, (folder / name).open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 24)
                count += 1
    return count


def install_wheels(wheels: Sequence[Path], target: Path, timeout: float) -> str:
    """Install every wheel into ``target`` (once per set of wheels); say how."""
    stamp = target / ".feedfast-gpu-check"
    want = "\n".join(sorted(w.name for w in wheels))
    if stamp.exists() and stamp.read_text(encoding="utf-8") == want:
        return f"already installed in {target}"
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--upgrade", "--no-compile",
           "--disable-pip-version-check", "--target", str(target), *map(str, wheels)]
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False).returncode == 0:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"pip install --target failed ({proc.returncode}): {tail[0]}")
        how = "pip install --no-index --no-deps --target"
    else:
        for wheel in wheels:
            unzip_wheel(wheel, target)
        how = "unzipped (pip is not available)"
    stamp.write_text(want, encoding="utf-8")
    return f"{how} {len(wheels)} wheels into {target}"


def unzip_wheel(wheel: Path, target: Path) -> None:
    """Install a wheel without pip: its files, with ``*.data/purelib|platlib`` moved to the top."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            dest = target.joinpath(*parts)
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, dest.open("wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                dest.chmod(mode)


def activate(target: Path) -> None:
    """Put ``target`` on ``sys.path`` (after what is installed) and on ``PYTHONPATH`` for children.

    An ``nvidia`` package already on the path as a regular package (CUDA wheels ship
    ``nvidia/__init__.py``) hides other ``nvidia`` folders, so ``target/nvidia`` is added to its
    ``__path__``.
    """
    if str(target) not in sys.path:
        sys.path.append(str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(target)) if p)
    importlib.invalidate_caches()
    portion = target / "nvidia"
    if not portion.is_dir():
        return
    nvidia = importlib.import_module("nvidia")
    path = getattr(nvidia, "__path__", None)
    if isinstance(path, list) and str(portion) not in path:
        path.append(str(portion))


def setup_section(ctx: Context, sec: Section) -> None:
    """Make DALI and the loaders' modules importable, from wheels when needed."""
    missing = probe(REQUIRED)
    if missing and ctx.wheels is not None:
        folder = ctx.wheels.resolve()
        if not folder.is_dir():
            raise RuntimeError(f"--wheels {folder}: not a folder")
        target = (ctx.target or folder / f"site-py{sys.version_info[0]}{sys.version_info[1]}").resolve()
        if (target / ".feedfast-gpu-check").exists():
            activate(target)
            missing = probe(REQUIRED)
            sec.data["installed"] = f"reused what an earlier run installed in {target}"
            say(sec.data["installed"])
        if missing:
            say(f"missing: {', '.join(f'{k} ({v})' for k, v in missing.items())}")
            for line in join_pieces(folder):
                say(line)
            wheels = sorted(folder.glob("*.whl"))
            if not wheels:
                raise RuntimeError(f"no .whl files (or NAME.part-* pieces) in {folder}")
            how = install_wheels(wheels, target, timeout=max(30.0, ctx.budget.seconds - ctx.budget.elapsed()))
            say(how)
            sec.data["installed"] = how
            activate(target)
            missing = probe(REQUIRED)
        sec.data["target"] = str(target)
    if "installed" in sec.data:
        sec.add("wheels", None, "", sec.data["installed"])
    report_modules(sec, missing)
    if missing:
        hint = "" if ctx.wheels else "; pass --wheels DIR (or WHEELS=DIR) holding the wheels (DALI-NOTES.md)"
        raise RuntimeError(f"not importable: {', '.join(missing)}{hint}")


def report_modules(sec: Section, missing: dict[str, str]) -> None:
    """One row per required module: its version and where it comes from, or why it failed."""
    installed = sec.data.get("target")
    for name in REQUIRED:
        if name in missing:
            sec.add(f"import {name}", None, "", f"failed: {missing[name]}")
            continue
        module = sys.modules[name]
        where = str(Path(getattr(module, "__file__", "") or "?").parent)
        origin = "from the wheels" if installed and where.startswith(installed) else "present"
        sec.add(f"import {name}", str(getattr(module, "__version__", "?")), "", f"{origin}: {where}")


# ---------------------------------------------------------------------------- dataset
def dataset_section(ctx: Context, sec: Section) -> None:
    """Generate (once) the shards every loader section reads."""
    from feedfast.cli.common import DEMO
    from feedfast.sources.shardlist import resolve_shards

    started = time.perf_counter()
    ctx.shards = make_dataset(ctx.sizes.samples, small=ctx.sizes.small_images)
    ctx.shard_paths = resolve_shards(ctx.shards)
    ctx.samples = ctx.sizes.samples or DEMO["samples"]
    sec.add("samples", ctx.samples, "JPEGs", f"{len(ctx.shard_paths)} shards: {ctx.shards}")
    sec.add("ready in", time.perf_counter() - started, "s", "generated once, then reused from the cache")


def make_dataset(samples: int | None, *, small: bool) -> str:
    """The demo dataset's pattern, or a ``samples``-sized set in the cache (generated once)."""
    from feedfast._env import cache_dir
    from feedfast.cli.common import demo_shards
    from feedfast.sources.index import load_index
    from feedfast.sources.synth import synth_shards

    if samples is None:
        return demo_shards()
    per, (lo, hi) = (32, (80, 160)) if small else (128, (300, 500))
    out = cache_dir() / f"gpu-check-{samples}-{per}-{lo}-{hi}"
    count = -(-samples // per)
    if not (out / "COMPLETE").exists():
        say(f"generating {samples} photo-like JPEGs ({lo} to {hi} px) in {out}")
        for path in synth_shards(out, samples=samples, per_shard=per, seed=0, min_side=lo, max_side=hi):
            load_index(path, cache_dir())
        (out / "COMPLETE").write_text("ok\n", encoding="utf-8")
    return str(out / f"train-{{0000..{count - 1:04d}}}.tar")


def need_shards(ctx: Context) -> str:
    """The dataset's pattern, or an error naming the section that should have made it."""
    if ctx.shards is None:
        raise RuntimeError("no dataset (the dataset section did not complete)")
    return ctx.shards


# ---------------------------------------------------------------------------- loader throughput
def forever(loader: Iterable[T]) -> Generator[T, None, None]:
    """Batches across epochs without end."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise RuntimeError("the loader yielded no batches")


def synchronizer(cuda: bool) -> Callable[[], None]:
    """``torch.cuda.synchronize`` on CUDA, nothing on the CPU."""
    return torch.cuda.synchronize if cuda else (lambda: None)


def timed_batches(batches: Iterator[Any], ctx: Context, sync: Callable[[], None]) -> tuple[float, Any]:
    """Images/s over ``sizes.batches`` batches after ``sizes.warmup``; also the first batch."""
    first = next(batches)
    for _ in range(ctx.sizes.warmup - 1):
        next(batches)
    sync()
    started, images = time.perf_counter(), 0
    for _ in range(ctx.sizes.batches):
        images += int(next(batches)[0].shape[0])
        ctx.budget.check()
    sync()
    return images / (time.perf_counter() - started), first


def loader_rate(ctx: Context, sec: Section, placement: str, device: str) -> None:
    """imagenet-train through feedfast.DataLoader: images/s, pinned bytes, plan placement."""
    import feedfast

    loader = feedfast.DataLoader(SPEC, shards=need_shards(ctx), batch_size=ctx.sizes.batch, placement=placement,
                                 device=device, overrides=ctx.overrides)
    batches = forever(loader)
    try:
        rate, (images, labels) = timed_batches(batches, ctx, synchronizer(device == "cuda"))
        pinned = loader.ring.pinned_bytes  # while the epoch's batches are held
    finally:
        batches.close()
        loader.close()
    if images.device.type != device or labels.device.type != device:
        raise CheckFailed(f"batches arrived on {images.device}/{labels.device}, not {device}")
    if placement == "cpu" and device == "cuda" and pinned == 0:
        raise CheckFailed("a CPU pipeline feeding CUDA held no pinned staging memory")
    decode = next((n for n in loader.plan.nodes if "decode" in n.op), None)
    deferred = [n.op for n in loader.plan.nodes if n.deferred]
    sec.add("images/s", rate, "img/s", f"{ctx.sizes.batches} batches of {ctx.sizes.batch} after "
            f"{ctx.sizes.warmup} warm-up, {loader.threads} threads, {tuple(images.shape[1:])} {images.dtype}")
    sec.add("pinned bytes held", pinned / 2**20, "MiB", f"ring of {len(loader.ring.slots)} slots")
    sec.add("plan", loader.plan.placement, "", f"decode: {decode.device if decode else '?'} "
            f"{decode.dali_op if decode else ''}; deferred to {device}: {deferred or 'none'}")
    sec.data.update(images_per_s=rate, pinned_bytes=pinned, placement=loader.plan.placement)


def loader_gpu_section(ctx: Context, sec: Section) -> None:
    """GPU-placed pipeline (mixed nvJPEG decode) delivering to CUDA."""
    loader_rate(ctx, sec, "gpu", "cuda")


def loader_cpu_cuda_section(ctx: Context, sec: Section) -> None:
    """CPU-placed pipeline delivering to CUDA (pinned prefetch, uint8 transfer)."""
    loader_rate(ctx, sec, "cpu", "cuda")


def loader_cpu_cpu_section(ctx: Context, sec: Section) -> None:
    """CPU-placed pipeline delivering to the CPU."""
    loader_rate(ctx, sec, "cpu", "cpu")


# ---------------------------------------------------------------------------- known GPU work
class Work(Protocol):
    """Known device work per step: ``launch`` enqueues about ``ms`` milliseconds and returns."""

    ms: float
    label: str

    def launch(self) -> None:
        """Enqueue the work without waiting for it."""

    def synchronize(self) -> None:
        """Wait until all enqueued work has finished."""

    def took_ms(self) -> float:
        """Mean device milliseconds of the launches since the last call (after ``synchronize``)."""


class MatmulWork:
    """``reps`` bf16 matmuls of ``n x n`` on CUDA, calibrated to about ``target_ms`` with CUDA events."""

    def __init__(self, target_ms: float, n: int = 8192) -> None:
        dev = torch.device("cuda")
        self.a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        self.out = torch.empty_like(self.a)
        self.time_ms(5)  # cuBLAS set-up and clocks
        per = self.time_ms(10) / 10
        self.reps = max(1, round(target_ms / per))
        self.ms = statistics.median(self.time_ms(self.reps) for _ in range(5))
        self.label = f"{self.reps} x {n}^2 bf16 matmul, timed with CUDA events"
        self._timed: list[tuple[Any, Any]] = []

    def _run(self, reps: int) -> None:
        for _ in range(reps):
            torch.mm(self.a, self.b, out=self.out)

    def time_ms(self, reps: int) -> float:
        """Milliseconds ``reps`` matmuls take on the GPU."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._run(reps)
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def launch(self) -> None:
        """Enqueue one step's matmuls between two timing events."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._run(self.reps)
        end.record()
        self._timed.append((start, end))

    def synchronize(self) -> None:
        """Wait for the GPU."""
        torch.cuda.synchronize()

    def took_ms(self) -> float:
        """Mean GPU milliseconds of the launches since the last call (events of each launch)."""
        times = [float(start.elapsed_time(end)) for start, end in self._timed]
        self._timed.clear()
        return statistics.fmean(times) if times else self.ms


class SimulatedWork:
    """The meter's clock-backed GPU stand-in (``SimulatedGpu``) running ``ms`` per launch."""

    def __init__(self, ms: float) -> None:
        from feedfast.meter import SimulatedGpu

        self.gpu = SimulatedGpu()
        self.ms = ms
        self.label = "SimulatedGpu (clock-backed events, dry run)"

    def launch(self) -> None:
        """Queue ``ms`` of simulated work."""
        self.gpu.launch(self.ms / 1e3)

    def synchronize(self) -> None:
        """Sleep until the simulated work is done."""
        self.gpu.synchronize()

    def took_ms(self) -> float:
        """Exactly ``ms``: simulated work takes what it is told."""
        return self.ms


def make_work(ctx: Context, target_ms: float) -> Work:
    """Calibrated matmuls on CUDA, the simulated GPU otherwise."""
    return MatmulWork(target_ms) if ctx.cuda else SimulatedWork(target_ms)


def meter_for(work: Work, **kwargs: Any) -> Any:
    """A StallMeter on CUDA events for matmul work, on the simulated GPU's events otherwise."""
    from feedfast.meter import StallMeter

    if isinstance(work, SimulatedWork):
        return StallMeter(events=work.gpu, **kwargs)
    return StallMeter(device="cuda", **kwargs)


# ---------------------------------------------------------------------------- stall meter
def sleeping_loader(sleep_ms: float, count: int) -> Iterator[torch.Tensor]:
    """``count`` one-sample batches, each after ``sleep_ms`` of host sleep (a slow loader)."""
    batch = torch.zeros(1)
    for _ in range(count):
        time.sleep(sleep_ms / 1e3)
        yield batch


def stall_case(ctx: Context, work: Work, sleep_ms: float) -> dict[str, Any]:
    """Run the injected stall once; the measured fraction and what it should be."""
    warmup = 3
    meter = meter_for(work, warmup=warmup, samplers=False, batch_size=1)
    for _ in meter.wrap(sleeping_loader(sleep_ms, ctx.sizes.stall_steps + warmup)):
        work.launch()
        ctx.budget.check()
    work.synchronize()
    meter.stop()
    s = meter.summary()
    if not s["steps"] or s["stall_fraction"] is None:
        raise CheckFailed(f"no complete steps measured ({s['pending_events']} pending)")
    work_ms = work.took_ms()  # what the GPU work took in this loop (clocks move)
    host_wait = s["host_stall_fraction"] * s["wall_s"]
    observed = max(0.0, host_wait - s["steps"] * work_ms / 1e3) / s["wall_s"]
    return {"measured": s["stall_fraction"], "design": max(0.0, sleep_ms - work.ms) / sleep_ms,
            "from_host_waits": observed, "work_ms": work_ms, "host_wait_ms": host_wait / s["steps"] * 1e3,
            "steps": s["steps"], "basis": s["basis"], "verdict": s["verdict"]}


def stall_section(ctx: Context, sec: Section) -> None:
    """Injected stalls of known size against the meter's event-based figure."""
    work = make_work(ctx, 10.0)
    sec.add("GPU work per step", work.ms, "ms", work.label)
    failures = []
    for sleep_ms in (20.0, 5.0):
        got = stall_case(ctx, work, sleep_ms)
        gap = abs(got["measured"] - got["from_host_waits"])
        ok = gap <= TOLERANCE
        sec.add(f"{sleep_ms:g} ms loader sleep: stall fraction", got["measured"], "fraction",
                f"expected {got['design']:.2f} (design), {got['from_host_waits']:.3f} (host waits); "
                f"gap {gap:.3f} {'<=' if ok else '>'} {TOLERANCE}; work {got['work_ms']:.1f} ms, "
                f"wait {got['host_wait_ms']:.1f} ms per step; {got['steps']} steps, {got['basis']}")
        sec.data[f"sleep_{sleep_ms:g}ms"] = got
        if not ok:
            failures.append(f"{sleep_ms:g} ms: measured {got['measured']:.3f}, expected {got['from_host_waits']:.3f}")
    if failures:
        raise CheckFailed("; ".join(failures))


# ---------------------------------------------------------------------------- NVML
def nvml_section(ctx: Context, sec: Section) -> None:
    """The meter's samplers while a GPU-bound loop runs; NVML figures must be there."""
    work = make_work(ctx, 20.0)
    meter = meter_for(work, samplers=True, sample_hz=20.0, batch_size=1)
    deadline = time.perf_counter() + ctx.sizes.nvml_seconds
    batch = torch.zeros(1, device=ctx.device)
    for _ in meter.wrap(iter(lambda: batch, None)):
        work.launch()
        work.synchronize()  # keeps the queue short; the GPU stays busy most of each step
        if time.perf_counter() > deadline:
            break
    meter.stop()
    s = meter.summary()
    status = s["samplers"].get("gpu", "no NVML sampler")
    for key, unit in (("gpu_util", "%"), ("gpu_util_max", "%"), ("gpu_mem_mb", "MiB"), ("gpu_sm_active", "%"),
                      ("cpu_util", "%")):
        sec.add(key, s[key], unit, status if key.startswith("gpu") else "")
    sec.data.update({k: s[k] for k in ("gpu_util", "gpu_util_max", "gpu_mem_mb", "gpu_sm_active", "cpu_util")})
    sec.data["status"] = status
    if not ctx.cuda:
        raise Skip(f"NVML figures need a GPU (dry run); sampler status: {status}")
    if s["gpu_util"] is None or s["gpu_mem_mb"] is None:
        raise CheckFailed(f"NVML figures are null: {status}")
    if s["gpu_util"] <= 0:
        raise CheckFailed(f"gpu_util is {s['gpu_util']} under a GPU-bound loop")


# ---------------------------------------------------------------------------- training
class TinyNet(nn.Module):
    """A small conv net standing in for ResNet-50 where torchvision is missing."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def make_model() -> tuple[nn.Module, str]:
    """torchvision's ResNet-50 when torchvision imports, else :class:`TinyNet`; and its name."""
    try:
        import torchvision
    except (ImportError, RuntimeError, AttributeError, OSError) as exc:  # absent, or built for another torch
        return TinyNet(), f"TinyNet stand-in (torchvision: {one_line(exc)})"
    return torchvision.models.resnet50(), "ResNet-50"


def train(ctx: Context, batches: Iterator[Any]) -> tuple[dict[str, Any], str, float]:
    """Train on ``batches`` under a StallMeter; its summary, the model's name and the last loss."""
    from feedfast.meter import StallMeter

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model, name = make_model()
    model = model.to(ctx.device)
    model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs lack it
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    meter = StallMeter(device="cuda" if ctx.cuda else "cpu", warmup=ctx.sizes.train_warmup)
    total, loss = ctx.sizes.train_warmup + ctx.sizes.train_steps, torch.zeros(())
    for step, (images, labels) in enumerate(meter.wrap(batches), 1):
        images = images.to(ctx.device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        labels = labels.to(ctx.device, non_blocking=True)
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ctx.budget.check()
        if step >= total:
            break
    synchronizer(ctx.cuda)()
    meter.stop()
    return meter.summary(), name, float(loss.detach())


def epoch_note(ctx: Context) -> str:
    """A warning when the run is longer than an epoch (the loader restarts inside the timing)."""
    per_epoch = max(1, ctx.samples // ctx.sizes.batch)
    steps = ctx.sizes.train_warmup + ctx.sizes.train_steps
    if per_epoch >= steps:
        return ""
    return (f"; an epoch is ~{per_epoch} batches, so epoch restarts are timed "
            f"(--samples {ctx.sizes.batch * steps * 2} avoids that)")


def report_training(ctx: Context, sec: Section, run: tuple[dict[str, Any], str, float], feed: str) -> None:
    """Rows for a training run (summary, model, last loss); a loss that is not finite fails the check."""
    summary, model, loss = run
    sec.add("images/s", summary["samples_per_s"], "img/s",
            f"{model}, {feed}, {summary['steps']} steps after {summary['warmup_steps']} warm-up{epoch_note(ctx)}")
    sec.add("stall fraction", summary["stall_fraction"], "fraction",
            f"{summary['verdict']}; basis {summary['basis']}; wait p50 {summary['wait_p50_ms'] or 0:.1f} ms")
    sec.add("GPU utilization (NVML)", summary["gpu_util"], "%", "" if summary["gpu_util"] is not None
            else str(summary["samplers"].get("gpu", "")))
    sec.data.update({k: summary[k] for k in ("samples_per_s", "stall_fraction", "verdict", "basis", "steps",
                                             "gpu_util", "wait_p50_ms", "step_p50_ms")}, model=model, loss=loss)
    if not torch.isfinite(torch.tensor(loss)):
        raise CheckFailed(f"the loss is {loss}")


def train_feedfast_section(ctx: Context, sec: Section) -> None:
    """The training loop fed by feedfast (GPU-placed on CUDA, CPU-placed in a dry run)."""
    import feedfast

    placement, device = ("gpu", "cuda") if ctx.cuda else ("cpu", "cpu")
    loader = feedfast.DataLoader(SPEC, shards=need_shards(ctx), batch_size=ctx.sizes.batch, placement=placement,
                                 device=device, overrides=ctx.overrides)
    batches = forever(loader)
    try:
        run = train(ctx, batches)
    finally:
        batches.close()
        loader.close()
    report_training(ctx, sec, run, f"{placement}-placed, {loader.threads} threads")


def train_torch_section(ctx: Context, sec: Section) -> None:
    """The training loop fed by the torchvision recipe (webdataset, PIL, DataLoader workers)."""
    from feedfast.baseline.torch_recipe import make_torch_loader
    from feedfast.cli.common import cores

    need_shards(ctx)
    workers = min(16, cores())
    loader = make_torch_loader(ctx.shard_paths, batch_size=ctx.sizes.batch, num_workers=workers,
                               size=ctx.sizes.image or 224)
    batches = forever(loader)
    try:
        run = train(ctx, batches)
    finally:
        batches.close()
    report_training(ctx, sec, run, f"{workers} DataLoader workers")


# ---------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Step:
    """A section to run: its key, table title, function and whether it needs CUDA."""

    name: str
    title: str
    run: Callable[[Context, Section], None]
    needs_cuda: bool = False


STEPS = (
    Step("setup", "setup", setup_section),
    Step("dataset", "dataset", dataset_section),
    Step("loader_gpu", "loader GPU-placed -> cuda", loader_gpu_section, needs_cuda=True),
    Step("loader_cpu_cuda", "loader CPU-placed -> cuda", loader_cpu_cuda_section, needs_cuda=True),
    Step("loader_cpu_cpu", "loader CPU-placed -> cpu", loader_cpu_cpu_section),
    Step("stall", "stall meter", stall_section),
    Step("nvml", "NVML sampler", nvml_section),
    Step("train_feedfast", "train <- feedfast", train_feedfast_section),
    Step("train_torch", "train <- torchvision recipe", train_torch_section),
)


def run_step(step: Step, ctx: Context) -> Section:
    """Run one section, recording a skip, an over-run or an error instead of raising."""
    sec = Section(step.name, step.title)
    started = time.perf_counter()
    try:
        if step.needs_cuda and not ctx.cuda:
            raise Skip("dry run (--dry-run)" if ctx.cuda_present else "no CUDA (dry run)")
        ctx.budget.check()
        step.run(ctx, sec)
    except Skip as exc:
        sec.status, sec.note = "skipped", f"skipped: {exc}"
    except OverBudget as exc:
        sec.status, sec.note = "over-budget", f"skipped: {exc}"
    except Exception as exc:  # noqa: BLE001 - every failure is recorded and the next section runs
        sec.status, sec.note = "error", f"error: {one_line(exc)}"
        sec.data["traceback"] = traceback.format_exc()
        print(sec.data["traceback"], file=sys.stderr, flush=True)
    sec.seconds = time.perf_counter() - started
    say(f"{step.name}: {sec.status} in {sec.seconds:.1f} s{' - ' + sec.note if sec.note else ''}")
    return sec


def fmt(figure: float | str | None) -> str:
    """A figure for the table."""
    if figure is None:
        return "-"
    if isinstance(figure, (str, int)):
        return str(figure)
    if abs(figure) >= 100:
        return f"{figure:,.0f}"
    return f"{figure:.2f}" if abs(figure) >= 1 else f"{figure:.3f}"


def table_rows(sections: Sequence[Section]) -> list[Row]:
    """Every section's rows, titled; a skipped or failed section gets a row with its note."""
    rows = []
    for sec in sections:
        rows += [Row(f"{sec.title}: {r.what}", r.figure, r.unit, r.note) for r in sec.rows]
        if sec.status != "ok":
            rows.append(Row(sec.title, None, "", sec.note))
    return rows


def clip(note: str, width: int = 200) -> str:
    """A note cut to ``width`` characters for the table (the JSON keeps it whole)."""
    return note if len(note) <= width else note[: width - 3] + "..."


def render(rows: Sequence[Row]) -> str:
    """The final table, aligned."""
    cells = [("what", "figure", "unit", "note")] + [(r.what, fmt(r.figure), r.unit, clip(r.note)) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    lines = [f"{w:<{widths[0]}}  {f:>{widths[1]}}  {u:<{widths[2]}}  {n}".rstrip() for w, f, u, n in cells]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)


def environment(ctx: Context) -> dict[str, Any]:
    """Versions and the device, for the JSON."""
    dali = sys.modules.get("nvidia.dali")
    return {"python": platform.python_version(), "torch": torch.__version__,
            "dali": getattr(dali, "__version__", None), "cuda": ctx.cuda, "dry_run": ctx.dry,
            "device": torch.cuda.get_device_name(0) if ctx.cuda else "cpu",
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="sections: " + ", ".join(s.name for s in STEPS))
    p.add_argument("--wheels", type=Path, default=None, help="folder of wheels (default: $WHEELS)")
    p.add_argument("--target", type=Path, default=None, help="install folder (default: WHEELS/site-pyXY)")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (implied without CUDA)")
    p.add_argument("--json", dest="json_path", default=None, help="write the results here")
    p.add_argument("--budget", type=float, default=450.0, help="seconds for the whole run (default 450)")
    p.add_argument("--samples", type=int, default=None, help="generate this many samples instead of the demo set")
    p.add_argument("--only", default=None, help="comma-separated sections to run (setup and dataset always run)")
    args = p.parse_args(argv)
    if args.budget <= 0 or (args.samples is not None and args.samples < 1):
        p.error("--budget must be > 0 and --samples >= 1")
    names = {s.name for s in STEPS}
    if args.only and not set(args.only.split(",")) <= names:
        p.error(f"--only {args.only!r}: sections are {', '.join(sorted(names))}")
    return args


def make_context(args: argparse.Namespace) -> Context:
    """Settings from the command line and the environment (``$WHEELS``)."""
    cuda = torch.cuda.is_available()
    dry = args.dry_run or not cuda
    sizes = DRY_SIZES if dry else GPU_SIZES
    if args.samples is not None:
        sizes = replace(sizes, samples=args.samples)
    wheels = args.wheels or (Path(os.environ["WHEELS"]) if os.environ.get("WHEELS") else None)
    if not cuda:
        say("torch sees no CUDA device: running as a dry run")
    return Context(sizes=sizes, dry=dry, cuda=cuda and not args.dry_run, cuda_present=cuda,
                   budget=Budget(args.budget), wheels=wheels, target=args.target)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every section, print the table, write the JSON; the exit status."""
    args = parse_args(argv)
    ctx = make_context(args)
    chosen = set(args.only.split(",")) | {"setup", "dataset"} if args.only else {s.name for s in STEPS}
    sections = [run_step(step, ctx) for step in STEPS if step.name in chosen]
    bad = [s.name for s in sections if s.status in ("error", "over-budget")]
    rows = table_rows(sections)
    print(render(rows), flush=True)
    code = 1 if bad else 0
    print(f"\n{len(sections)} sections in {ctx.budget.elapsed():.0f} s; "
          f"{'problems in: ' + ', '.join(bad) if bad else 'all ran'}", flush=True)
    if args.json_path:
        out = {"version": 1, "exit_code": code, "wall_s": ctx.budget.elapsed(), "budget_s": ctx.budget.seconds,
               "environment": environment(ctx), "sizes": asdict(ctx.sizes),
               "sections": {s.name: asdict(s) for s in sections}, "table": [asdict(r) for r in rows]}
        Path(args.json_path).write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main())
