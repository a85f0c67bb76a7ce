"""``gpu_check.py``'s training rows: a model trained on feedfast's batches, then on the torchvision recipe's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from gpucheck_common import SPEC, CheckFailed, Context, Section, one_line
from gpucheck_sections import forever, need_shards, synchronizer
from torch import nn


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
    from feedfast._env import usable_cores
    from feedfast.baseline.torch_recipe import make_torch_loader

    need_shards(ctx)
    workers = min(16, usable_cores())
    loader = make_torch_loader(ctx.shard_paths, batch_size=ctx.sizes.batch, num_workers=workers,
                               size=ctx.sizes.image or 224)
    batches = forever(loader)
    try:
        run = train(ctx, batches)
    finally:
        batches.close()
    report_training(ctx, sec, run, f"{workers} DataLoader workers")
