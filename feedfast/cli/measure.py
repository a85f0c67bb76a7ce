"""Timed runs for ``feedfast bench`` and ``feedfast analyze``: a loop under a StallMeter.

A run takes ``warmup`` batches back to back (they are not timed, and taking them without a
pause empties the loader's prefetch queue), then times ``count`` batches or ``seconds``.
With a simulated step, the consumer calls ``time.sleep(step_s)`` after each timed batch:
sleeping frees the core the way a GPU step does (the host thread waits on the GPU while the
loader's threads keep working), so the wait measured is what a GPU job of that step time
would see. A busy-wait would instead take a core from the loader, which a GPU job does not.
"""

from __future__ import annotations

import io
import resource
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil

from feedfast.meter import NvmlSampler, StallMeter


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


def forever(loader: Iterable[Any]) -> Iterator[Any]:
    """Batches of ``loader``, epoch after epoch."""
    while True:
        yield from loader


def batch_samples(batch: Any) -> int:
    """The first dimension of a batch's first tensor (tuple, list or dict batches)."""
    first = batch[0] if isinstance(batch, (tuple, list)) else next(iter(batch.values()))
    return int(first.shape[0])


def timed_run(batches: Iterable[Any], plan: RunPlan, *, started: float) -> tuple[dict[str, Any], StallMeter]:
    """Run ``plan`` over ``batches`` under a host-wait StallMeter.

    Args:
        batches: an endless iterable of batches (see :func:`forever`).
        plan: counts, duration and simulated step.
        started: ``time.perf_counter()`` when the loader was created, for time to first batch.

    Returns:
        The figures (``samples_per_s``, ``batches``, ``samples``, ``wall_s``,
        ``time_to_first_batch_s``, ``cpu_util``, ``peak_rss_mb``, ``stall_fraction``,
        ``wait_ms_per_batch``, ``batch_ms``, ``gpu_util``, ``gpu_status``) and the stopped meter.
    """
    from tqdm import tqdm

    samplers = [NvmlSampler(hz=5.0)] if plan.gpu else False
    meter = StallMeter(warmup=plan.warmup, device="cpu", samplers=samplers)
    proc = psutil.Process()
    bar = tqdm(total=None if plan.seconds else plan.count, desc=plan.label, unit="batch", disable=plan.quiet,
               file=sys.stderr)
    it = iter(batches)
    first_at = None
    warm, n, samples = plan.warmup, 0, 0
    t0, cpu0 = time.perf_counter(), _tree_cpu(proc)
    while not plan.done(n, time.perf_counter() - t0):
        batch = meter.fetch(it)
        first_at = first_at or time.perf_counter()
        if warm > 0:
            warm -= 1
            t0, cpu0 = time.perf_counter(), _tree_cpu(proc)
            continue
        n, samples = n + 1, samples + batch_samples(batch)
        bar.update(1)
        if plan.step_s:
            time.sleep(plan.step_s)
    wall = time.perf_counter() - t0
    cpu = _tree_cpu(proc) - cpu0
    meter.stop()
    bar.close()
    return _figures(meter, n, samples, wall, cpu, (first_at or time.perf_counter()) - started), meter


def _figures(meter: StallMeter, n: int, samples: int, wall: float, cpu_s: float, ttfb: float) -> dict[str, Any]:
    summary = meter.summary()
    cores = psutil.cpu_count() or 1
    return {
        "samples_per_s": samples / wall if wall > 0 else 0.0, "batches": n, "samples": samples, "wall_s": wall,
        "batch_ms": wall / n * 1e3 if n else None, "time_to_first_batch_s": ttfb,
        "cpu_util": round(cpu_s / wall / cores * 100, 1) if wall > 0 else 0.0,
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "stall_fraction": summary["stall_fraction"], "verdict": summary["verdict"],
        "wait_ms_per_batch": summary["wait_s"] / summary["steps"] * 1e3 if summary["steps"] else None,
        "required_samples_per_s": summary["required_samples_per_s"],
        "gpu_util": summary["gpu_util"],
        "gpu_status": summary["samplers"].get("gpu", "not sampled"),
    }


def _tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds used so far by this process and its children (gone children are skipped)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue  # a child that exited between listing and reading: its time is lost
        total += t.user + t.system
    return total


def _peak_rss_mb() -> float:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(peak_kb, children) / 1024.0


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
