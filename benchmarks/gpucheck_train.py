"""``gpu_check.py``'s training rows: ResNet-50 (bf16 autocast, channels_last, SGD) fed five ways.

(a) feedfast GPU-placed (DALI, nvJPEG), (b) feedfast CPU-placed on DALI and (b2) on the threaded
path, both through the pinned ring to CUDA, (c) the torchvision recipe, (d) the threaded path
tuned; each gives one row: samples/s, the meter's stall fraction (CUDA events), NVML
utilization and the seconds from creating the loader to the first batch.

Every row is what its label says and measures the same way: the backend is asked for by name
and checked after the run; at least ``Sizes.train_steps`` steps are measured (60 on a GPU, twice
the meter's minimum for a verdict), after ``train_warmup`` steps that hold the pipeline's build
and cuDNN's autotuning; NVML samples only the measured steps; and the torchvision batches are
copied to the GPU inside the measured wait (pinned, non-blocking), as feedfast's are.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from gpucheck_common import SPEC, CheckFailed, Context, Section, Skip, one_line
from gpucheck_sections import forever, need_shards, synchronizer
from torch import nn


class TinyNet(nn.Module):
    """A small conv net standing in for ResNet-50 in a dry run, or where torchvision is missing."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def make_model(dry: bool) -> tuple[nn.Module, str]:
    """ResNet-50, or :class:`TinyNet` in a dry run or where torchvision is missing; and its name.

    torchvision's import is tried once per run (:func:`resnet50_or_why`), so every feed trains
    the same model even when another module imports torchvision later.
    """
    if dry:
        return TinyNet(), "TinyNet (dry run)"
    resnet50, why = resnet50_or_why()
    if resnet50 is None:
        return TinyNet(), f"TinyNet stand-in (torchvision: {why})"
    return resnet50(), "ResNet-50"


@functools.cache
def resnet50_or_why() -> tuple[Any, str]:
    """torchvision's ``resnet50`` constructor, or None and why torchvision does not import."""
    try:
        import torchvision
    except (ImportError, RuntimeError, AttributeError, OSError) as exc:  # absent, or built for another torch
        return None, one_line(exc)
    return torchvision.models.resnet50, ""


@dataclass
class Trainee:
    """A model on the device, in channels_last, with its optimizer; built before the loader, so
    that the time to the first batch is the loader's alone."""

    model: nn.Module
    name: str
    opt: torch.optim.Optimizer


@dataclass
class TrainRun:
    """What a training run measured: the meter's summary, the model, the last loss, the first batch's wait."""

    summary: dict[str, Any]
    model: str
    loss: float
    first_batch_s: float | None
    nvml: dict[str, Any]  # the NVML sampler's figures and status over the measured steps only


def prepare(ctx: Context) -> Trainee:
    """ResNet-50 (or the tiny net) on ``ctx.device`` in channels_last, and SGD."""
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model, name = make_model(ctx.dry)
    model = model.to(ctx.device)
    model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs lack it
    return Trainee(model, name, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4))


def train(ctx: Context, trainee: Trainee, batches: Iterator[Any], started: float) -> TrainRun:
    """Train on ``batches`` (bf16 autocast) under a StallMeter; ``started`` is when the loader was created.

    NVML is sampled from the first measured step to the last (not during the warm-up steps).
    """
    from feedfast.meter import NvmlSampler, StallMeter

    model, opt, loss_fn = trainee.model, trainee.opt, nn.CrossEntropyLoss()
    meter = StallMeter(device="cuda" if ctx.cuda else "cpu", warmup=ctx.sizes.train_warmup, samplers=False)
    nvml = NvmlSampler(cuda_index=torch.cuda.current_device() if ctx.cuda else None, hz=20.0)
    total, loss, first = ctx.sizes.train_warmup + ctx.sizes.train_steps, torch.zeros(()), None
    for step, (images, labels) in enumerate(meter.wrap(batches), 1):
        if first is None:
            first = time.perf_counter() - started
        if step == ctx.sizes.train_warmup + 1:
            nvml.start()  # the measured window: after the build's and cuDNN's warm-up steps
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
    nvml.stop()
    return TrainRun(meter.summary(), trainee.name, float(loss.detach()), first,
                    {**nvml.figures(), "status": nvml.status()})


def epoch_note(ctx: Context, batch: int) -> str:
    """A warning when the run is longer than an epoch (the loader restarts inside the timing)."""
    per_epoch = max(1, ctx.samples // batch)
    steps = ctx.sizes.train_warmup + ctx.sizes.train_steps
    if per_epoch >= steps:
        return ""
    return (f"; an epoch is ~{per_epoch} batches, so epoch restarts are timed "
            f"(--samples {batch * steps * 2} avoids that)")


def report_training(ctx: Context, sec: Section, run: TrainRun, feed: str, batch: int | None = None, *,
                    epochs: bool = True) -> None:
    """The feed's row (samples/s, stall, GPU util, first batch) at ``batch`` (default: the training rows' batch;
    ``epochs``: the feed has epochs, whose restarts the note counts); a loss that is not finite fails the check."""
    s, batch = run.summary, batch or ctx.sizes.batch
    util = run.nvml["gpu_util"]
    nvml = "NVML over the measured steps" if util is not None else f"NVML: {run.nvml['status']}"
    sec.add_feed("", samples_per_s=s["samples_per_s"], stall=s["stall_fraction"], gpu_util=util,
                 first_batch_s=run.first_batch_s,
                 note=f"{run.model} bf16 channels_last, batch {batch}, {feed}; {s['steps']} steps after "
                      f"{s['warmup_steps']} warm-up; {s['verdict']} ({s['basis']}); {nvml}{epoch_note(ctx, batch) if epochs else ''}")
    sec.data.update({k: s[k] for k in ("samples_per_s", "stall_fraction", "verdict", "basis", "steps",
                                       "wait_p50_ms", "step_p50_ms")},
                    gpu_util=util, nvml=run.nvml, model=run.model, loss=run.loss, first_batch_s=run.first_batch_s)
    if not torch.isfinite(torch.tensor(run.loss)):
        raise CheckFailed(f"the loss is {run.loss}")
    if s["steps"] < ctx.sizes.train_steps:
        raise CheckFailed(f"{s['steps']} measured steps, fewer than the row's {ctx.sizes.train_steps}")


def train_on_feedfast(ctx: Context, sec: Section, placement: str, device: str, backend: str,
                      tune: bool = False) -> None:
    """The training loop fed by ``feedfast.DataLoader`` with this placement, delivery device and backend (and
    tuning); a loader that ran another backend or placement fails the row (its label would lie)."""
    import feedfast

    trainee = prepare(ctx)
    started = time.perf_counter()
    loader = feedfast.DataLoader(SPEC, shards=need_shards(ctx), batch_size=ctx.sizes.batch, placement=placement,
                                 device=device, overrides=ctx.overrides, tune=tune, backend=backend,
                                 timeout=ctx.sizes.loader_timeout)
    batches = forever(loader)
    try:
        run = train(ctx, trainee, checked(batches, device), started)
    finally:
        batches.close()
        loader.close()
    if loader.plan.placement != placement or loader.backend != backend:
        raise CheckFailed(f"asked for {backend} {placement}-placed, ran {loader.backend} "
                          f"{loader.plan.placement}-placed")
    sec.data.update(backend=loader.backend, placement=loader.plan.placement)
    feed = f"feedfast {backend} {placement}-placed -> {device}, {loader.threads} threads"
    if tune:
        tuning = sec.data["tuning"] = loader.tuning()
        decision = tuning["decision"]
        feed = (f"feedfast {backend} {placement}-placed -> {device}, tune=True ({tuning['state']}: threads "
                f"{decision['threads']}, prefetch {decision['prefetch']}; {tuning['reason'] or 'no decision yet'})")
    report_training(ctx, sec, run, feed)


def checked(batches: Iterator[Any], device: str) -> Generator[Any, None, None]:
    """``batches``, each checked to arrive on ``device`` (``cuda``: the current CUDA device)."""
    want = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device(device)
    for images, labels in batches:
        if images.device != want or labels.device != want:
            raise CheckFailed(f"batches arrived on {images.device}/{labels.device}, not {want}")
        yield images, labels


def train_feedfast_gpu_section(ctx: Context, sec: Section) -> None:
    """(a) feedfast GPU-placed (DALI: ``mixed`` nvJPEG decode, GPU augmentation) delivering to CUDA."""
    train_on_feedfast(ctx, sec, "gpu", "cuda", "dali")


def train_feedfast_cpu_section(ctx: Context, sec: Section) -> None:
    """(b) feedfast CPU-placed on DALI's CPU operators, through the pinned ring to CUDA (the CPU in a dry run)."""
    train_on_feedfast(ctx, sec, "cpu", "cuda" if ctx.cuda else "cpu", "dali")


def train_threads_section(ctx: Context, sec: Section) -> None:
    """(b2) feedfast CPU-placed on the threaded path (pillow-simd, reduced-size decode), through the pinned ring."""
    train_on_feedfast(ctx, sec, "cpu", "cuda" if ctx.cuda else "cpu", "threads")


def train_tuned_section(ctx: Context, sec: Section) -> None:
    """(d) feedfast's threaded path with ``tune=True``: the search runs in the first batches of this loop (issue
    16); the decision, its reasons and the trials are recorded beside the rate."""
    train_on_feedfast(ctx, sec, "cpu", "cuda" if ctx.cuda else "cpu", "threads", tune=True)


def train_torch_section(ctx: Context, sec: Section) -> None:
    """(c) the torchvision recipe (webdataset, PIL, 16 DataLoader workers where there are 16 cores)."""
    from feedfast._env import usable_cores
    from feedfast.baseline.torch_recipe import make_torch_loader
    from feedfast.baseline.vision import transforms
    from feedfast.errors import UserError

    try:
        transforms()
    except UserError as exc:  # a machine without torchvision (the small set) has no torchvision row to measure
        raise Skip(str(exc)) from exc
    need_shards(ctx)
    workers = min(16, usable_cores())
    trainee = prepare(ctx)
    started = time.perf_counter()
    loader = make_torch_loader(ctx.shard_paths, batch_size=ctx.sizes.batch, num_workers=workers,
                               size=ctx.sizes.image or 224)
    if workers > 0:
        loader.timeout = ctx.sizes.loader_timeout  # torch's own: a worker that hangs raises instead
    batches = forever(loader)
    try:
        run = train(ctx, trainee, on_device(batches, ctx.device), started)
    finally:
        batches.close()
    report_training(ctx, sec, run, f"torchvision recipe, {workers} DataLoader workers, pinned, copied to "
                                   f"{ctx.device.type} inside the measured wait")


def on_device(batches: Iterator[Any], device: torch.device) -> Generator[Any, None, None]:
    """``batches`` copied to ``device`` (non-blocking from pinned memory) before each is handed over, so that the
    copy is ordered before the meter's ready event, inside the measured wait, as feedfast's copy is."""
    for images, labels in batches:
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
