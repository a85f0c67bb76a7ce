"""Timed runs for ``feedfast bench`` and ``feedfast analyze``: a loop under a StallMeter.

A run takes ``warmup`` batches back to back (they are not timed, and taking them without a
pause empties the loader's prefetch queue), then times ``count`` batches or ``seconds``.
With a simulated step, the consumer calls ``time.sleep(step_s)`` after each timed batch:
sleeping frees the core the way a GPU step does (the host thread waits on the GPU while the
loader's threads keep working), so the wait measured is what a GPU job of that step time
would see. A busy-wait would instead take a core from the loader, which a GPU job does not.

Samples/s counts delivered samples only: a loader that pads its last batch says how many it
delivered (``delivered``, e.g. feedfast's ``stats()["delivered"]``); other batches count
their rows. CPU time and peak memory are those of the processes a run is given
(``processes``; by default this one and all its children). A comparison times one loader
at a time, each built and closed within its round (:mod:`feedfast.baseline.timing`).
"""

from __future__ import annotations

import io
import statistics
import sys
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from feedfast.meter import NvmlSampler, StallMeter
from feedfast.meter.stats import verdict


@dataclass(frozen=True)
class RunPlan:
    """How long to run and what to simulate.

    Attributes:
        warmup: batches taken first and left out of every figure.
        count: batches to time (ignored when ``seconds`` is set).
        seconds: time this long instead of ``count`` batches.
        step_s: simulated compute per batch, seconds (None: no step).
        quiet: no progress bar.
        label: the progress bar's label.
        gpu: sample GPU utilization through NVML.
    """

    warmup: int
    count: int
    seconds: float | None = None
    step_s: float | None = None
    quiet: bool = True
    label: str = "run"
    gpu: bool = True

    def done(self, batches: int, elapsed: float) -> bool:
        """Whether the timed part is over after ``batches`` batches and ``elapsed`` seconds."""
        if self.seconds is not None:
            return batches > 0 and elapsed >= self.seconds
        return batches >= self.count


def forever(loader: Iterable[Any]) -> Generator[Any, None, None]:
    """Batches of ``loader``, epoch after epoch (a generator: ``close()`` ends it)."""
    while True:
        yield from loader


def batch_samples(batch: Any) -> int:
    """The first dimension of a batch's first tensor (tuple, list or dict batches)."""
    first = batch[0] if isinstance(batch, (tuple, list)) else next(iter(batch.values()))
    return int(first.shape[0])


def all_processes() -> list[psutil.Process]:
    """This process and all its children: the default scope of a run."""
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def timed_run(batches: Iterable[Any], plan: RunPlan, *, started: float, delivered: Callable[[], int] | None = None,
              processes: Callable[[], list[psutil.Process]] = all_processes) -> tuple[dict[str, Any], StallMeter]:
    """Run ``plan`` over ``batches`` under a host-wait StallMeter.

    Args:
        batches: an endless iterable of batches (see :func:`forever`).
        plan: counts, duration and simulated step.
        started: ``time.perf_counter()`` when the loader was created, for time to first batch.
        delivered: the loader's running count of delivered samples (padding excluded); None
            counts each batch's rows.
        processes: the processes whose CPU time and memory are the loader's.

    Returns:
        The figures (``samples_per_s``, ``batches``, ``samples``, ``wall_s``,
        ``time_to_first_batch_s``, ``cpu_s`` (CPU seconds of ``processes`` over the timed batches),
        ``cpu_util``, ``peak_rss_mb``, ``stall_fraction``,
        ``wait_ms_per_batch``, ``batch_ms``, ``gpu_util``, ``gpu_status``) and the stopped meter.
    """
    from tqdm import tqdm

    samplers = [NvmlSampler(hz=5.0)] if plan.gpu else False
    meter = StallMeter(warmup=plan.warmup, device="cpu", samplers=samplers)
    bar = tqdm(total=None if plan.seconds else plan.count, desc=plan.label, unit="batch", disable=plan.quiet,
               file=sys.stderr)
    it = iter(batches)
    count = delivered or (lambda: 0)
    first_at = None
    warm, n, rows = plan.warmup, 0, 0
    procs = processes()
    t0, cpu0, done0, peak = time.perf_counter(), _cpu_by_pid(procs), count(), _rss(procs)
    while not plan.done(n, time.perf_counter() - t0):
        batch = meter.fetch(it)
        first_at = first_at or time.perf_counter()
        if warm > 0:
            warm -= 1
            procs = processes()  # a loader's workers start in its first batches
            t0, cpu0, done0 = time.perf_counter(), _cpu_by_pid(procs), count()
            continue
        n, rows = n + 1, rows + batch_samples(batch)
        peak = max(peak, _rss(procs))
        bar.update(1)
        if plan.step_s:
            time.sleep(plan.step_s)
    wall = time.perf_counter() - t0
    procs = processes()
    cpu = _cpu_seconds(procs, cpu0)
    samples = rows if delivered is None else count() - done0
    meter.stop()
    bar.close()
    peak = max(peak, _rss(procs))
    return _figures(meter, n, samples, wall, cpu, (first_at or time.perf_counter()) - started, peak), meter


def _figures(meter: StallMeter, n: int, samples: int, wall: float, cpu_s: float, ttfb: float,
             peak_bytes: int) -> dict[str, Any]:
    summary = meter.summary()
    cores = psutil.cpu_count() or 1
    return {
        "samples_per_s": samples / wall if wall > 0 else 0.0, "batches": n, "samples": samples, "wall_s": wall,
        "cpu_s": cpu_s, "batch_ms": wall / n * 1e3 if n else None, "time_to_first_batch_s": ttfb,
        "cpu_util": round(cpu_s / wall / cores * 100, 1) if wall > 0 else 0.0,
        "peak_rss_mb": round(peak_bytes / 2**20, 1),
        "stall_fraction": summary["stall_fraction"], "verdict": summary["verdict"],
        "wait_ms_per_batch": summary["wait_s"] / summary["steps"] * 1e3 if summary["steps"] else None,
        "required_samples_per_s": summary["required_samples_per_s"],
        "gpu_util": summary["gpu_util"],
        "gpu_status": summary["samplers"].get("gpu", "not sampled"),
    }


def _cpu_by_pid(procs: list[psutil.Process]) -> dict[int, float]:
    """CPU seconds used so far by each process (gone ones are skipped)."""
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue  # exited between listing and reading
        out[p.pid] = t.user + t.system
    return out


def _cpu_seconds(procs: list[psutil.Process], before: dict[int, float]) -> float:
    """CPU seconds the processes used since ``before`` (a process new since then counts from its start)."""
    now = _cpu_by_pid(procs)
    return sum(max(0.0, used - before.get(pid, 0.0)) for pid, used in now.items())


def _rss(procs: list[psutil.Process]) -> int:
    """Resident bytes of the processes together (pages shared between them count in each)."""
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def _weighted(runs: Sequence[dict[str, Any]], key: str, weight: str) -> float | None:
    pairs = [(r[key], r[weight]) for r in runs if r[key] is not None]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if pairs and total > 0 else None


def combine_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One loader's figures over several rounds of :func:`timed_run`.

    ``samples_per_s`` is the median of the rounds' (``round_samples_per_s`` lists them);
    counts and times (CPU seconds too) add up; CPU and GPU use and the stall are weighted by each round's wall
    time, the wait per batch by its batches; memory is the peak; time to first batch is the
    first round's.
    """
    if not runs:
        raise ValueError("combine_runs needs at least one run")
    batches, wall = sum(r["batches"] for r in runs), sum(r["wall_s"] for r in runs)
    stall = _weighted(runs, "stall_fraction", "wall_s")
    return {
        "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
        "round_samples_per_s": [r["samples_per_s"] for r in runs], "rounds": len(runs),
        "batches": batches, "samples": sum(r["samples"] for r in runs), "wall_s": wall,
        "cpu_s": sum(r["cpu_s"] for r in runs),
        "batch_ms": wall / batches * 1e3 if batches else None, "time_to_first_batch_s": runs[0]["time_to_first_batch_s"],
        "cpu_util": round(_weighted(runs, "cpu_util", "wall_s") or 0.0, 1),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "stall_fraction": stall, "verdict": verdict(stall) if stall is not None else runs[0]["verdict"],
        "wait_ms_per_batch": _weighted(runs, "wait_ms_per_batch", "batches"),
        "required_samples_per_s": runs[0]["required_samples_per_s"],
        "gpu_util": _weighted(runs, "gpu_util", "wall_s"), "gpu_status": runs[0]["gpu_status"],
    }


def pil_decode_ms(images: list[bytes], *, seconds: float) -> float:
    """Mean milliseconds to fully decode one of ``images`` with PIL on one thread.

    Decodes the images in turn for about ``seconds`` (at least one pass over them).
    """
    from PIL import Image

    if not images:
        raise ValueError("pil_decode_ms needs at least one image")
    done, t0 = 0, time.perf_counter()
    while done < len(images) or time.perf_counter() - t0 < seconds:
        with Image.open(io.BytesIO(images[done % len(images)])) as img:
            img.convert("RGB").load()
        done += 1
    return (time.perf_counter() - t0) / done * 1e3
