"""``gpu_check.py``'s measuring sections: the dataset, loader throughput, the stall meter and NVML."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, TypeVar

import torch
from gpucheck_common import SPEC, TOLERANCE, CheckFailed, Context, Section, Skip, say
from gpucheck_work import Work, make_work, meter_for

T = TypeVar("T")


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
    from feedfast.cli.common import demo_shards
    from feedfast.write.demo import shard_pattern, synth_dataset

    if samples is None:
        return demo_shards()
    per, (lo, hi) = (32, (80, 160)) if small else (128, (300, 500))
    paths = synth_dataset(samples=samples, per_shard=per, min_side=lo, max_side=hi,
                          announce=lambda out: say(f"generating {samples} photo-like JPEGs ({lo} to {hi} px) in {out}"))
    return shard_pattern(paths)


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
    """imagenet-train through feedfast.DataLoader: images/s, pinned bytes, plan placement, and the backend that ran."""
    import feedfast

    loader = feedfast.DataLoader(SPEC, shards=need_shards(ctx), batch_size=ctx.sizes.batch, placement=placement,
                                 device=device, overrides=ctx.overrides, timeout=ctx.sizes.loader_timeout)
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
    sec.add(f"images/s, backend {loader.backend}", rate, "img/s", f"{ctx.sizes.batches} batches of "
            f"{ctx.sizes.batch} after {ctx.sizes.warmup} warm-up, {loader.threads} threads, "
            f"{tuple(images.shape[1:])} {images.dtype}")
    sec.add("pinned bytes held", pinned / 2**20, "MiB", f"ring of {len(loader.ring.slots)} slots")
    sec.add("plan", loader.plan.placement, "", f"decode: {decode.device if decode else '?'} "
            f"{decode.dali_op if decode else ''}; deferred to {device}: {deferred or 'none'}")
    sec.data.update(images_per_s=rate, pinned_bytes=pinned, placement=loader.plan.placement, backend=loader.backend)
    ctx.results[sec.name] = rate


def loader_gpu_section(ctx: Context, sec: Section) -> None:
    """GPU-placed pipeline (mixed nvJPEG decode) delivering to CUDA."""
    loader_rate(ctx, sec, "gpu", "cuda")


def loader_cpu_cuda_section(ctx: Context, sec: Section) -> None:
    """CPU-placed pipeline delivering to CUDA (pinned prefetch, uint8 transfer)."""
    loader_rate(ctx, sec, "cpu", "cuda")


def loader_cpu_cpu_section(ctx: Context, sec: Section) -> None:
    """CPU-placed pipeline delivering to the CPU."""
    loader_rate(ctx, sec, "cpu", "cpu")


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
