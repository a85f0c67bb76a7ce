"""``gpu_check.py``'s rows at the anchor's batch (256 on a GPU): the README's default loader, the compute ceiling,
and the recipe pipeline.

- ``train_synthetic``: ResNet-50 (bf16 autocast, channels_last, SGD: :mod:`gpucheck_train`'s loop) on one
  synthetic batch kept on the device, the rate no loader can beat (DS-Analyzer's compute ceiling).
- ``train_default``: the same loop fed by ``feedfast.DataLoader("imagenet-train", shards=..., batch_size=256,
  device="cuda")``, nothing else asked; its rate as a share of ``train_synthetic``'s must be at least
  :data:`TRAIN_SHARE` (issue 36).
- ``recipe_gpu``: ``imagenet-train-recipe`` (RandomResizedCrop 176, flip, TrivialAugmentWide, normalize,
  RandomErasing, mixup/cutmix) GPU-placed on DALI, alone: its rate and its share of ``dali_anchor``'s (reported;
  no target: it does more per image than the anchor's graph, at a smaller crop).

The default call is the README's on a GPU (the loader then must run DALI GPU-placed: anything else fails the row,
whose label would lie); a dry run stands in DALI CPU-placed at the dry run's small sizes, to the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from gpucheck_common import CheckFailed, Context, Section, Target, enforce, judge
from gpucheck_sections import forever, need_shards
from gpucheck_timing import timed_epochs
from gpucheck_train import TrainRun, checked, prepare, report_training, train

DEFAULT_SPEC = "imagenet-train"
"""The shipped pipeline as the issue's default call names it."""
RECIPE_SPEC = "imagenet-train-recipe"
TRAIN_SHARE = 0.95
"""ResNet-50 fed by the default loader must train at least this share of its rate on synthetic data."""


# ---------------------------------------------------------------------------- the default call
def default_loader(ctx: Context, batch: int, spec: str = DEFAULT_SPEC, *, shards: str | None = None,
                   **asked: Any) -> Any:
    """``feedfast.DataLoader(spec, shards=..., batch_size=batch, device="cuda", **asked)`` on a GPU; in a dry run the
    same DALI CPU-placed to the CPU at the dry run's crop. ``shards``: what it reads (None: the check's shards);
    ``timeout=`` only bounds a wait (the lease)."""
    import feedfast

    shards = shards or need_shards(ctx)
    if ctx.cuda:
        return feedfast.DataLoader(spec, shards=shards, batch_size=batch, device="cuda",
                                   timeout=ctx.sizes.loader_timeout, **asked)
    return feedfast.DataLoader(spec, shards=shards, batch_size=batch, device="cpu", placement="cpu",
                               backend="dali", overrides=ctx.overrides, timeout=ctx.sizes.loader_timeout)


def default_call(ctx: Context, batch: int, spec: str = DEFAULT_SPEC) -> str:
    """The call :func:`default_loader` makes, in words for a row."""
    if ctx.cuda:
        return f'DataLoader("{spec}", batch_size={batch}, device="cuda")'
    return f'DataLoader("{spec}", batch_size={batch}, device="cpu", placement="cpu", backend="dali") (dry run)'


def ran_as_default(ctx: Context, loader: Any, what: str = "the default call") -> None:
    """On a GPU the default call must have run DALI GPU-placed (the README's promise; what the rows compare)."""
    want = ("dali", "gpu") if ctx.cuda else ("dali", "cpu")
    if (loader.backend, loader.plan.placement) != want:
        raise CheckFailed(f"{what} ran {loader.backend} {loader.plan.placement}-placed, not "
                          f"{want[0]} {want[1]}-placed")


# ---------------------------------------------------------------------------- training at batch 256
def synthetic_batches(ctx: Context, batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One batch of normalized-looking images (channels_last) and labels on the device, handed out forever."""
    size = ctx.sizes.image or 224
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, size, size, generator=gen).to(ctx.device)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), generator=gen).to(ctx.device)
    while True:
        yield images, labels


def train_synthetic_section(ctx: Context, sec: Section) -> None:
    """The compute ceiling: the training loop on a synthetic batch on the device (no loader)."""
    batch = ctx.sizes.decode_batch
    trainee = prepare(ctx)
    run = train(ctx, trainee, synthetic_batches(ctx, batch), time.perf_counter())
    run.first_batch_s = None  # no loader: nothing to wait for
    report_training(ctx, sec, run, "synthetic data on the device (the compute ceiling)", batch=batch,
                    epochs=False)
    ctx.results["synthetic_images_per_s"] = run.summary["samples_per_s"]


def train_default_section(ctx: Context, sec: Section) -> None:
    """The training loop fed by the default loader at the anchor's batch, as a share of ``train_synthetic``."""
    batch = ctx.sizes.decode_batch
    trainee = prepare(ctx)
    started = time.perf_counter()
    loader = default_loader(ctx, batch)
    batches = forever(loader)
    try:
        run: TrainRun = train(ctx, trainee, checked(batches, ctx.device.type), started)
    finally:
        batches.close()
        loader.close()
    ran_as_default(ctx, loader)
    sec.data.update(backend=loader.backend, placement=loader.plan.placement)
    report_training(ctx, sec, run, f"{default_call(ctx, batch)}: {loader.backend} {loader.plan.placement}-placed, "
                                   f"{loader.threads} threads", batch=batch)
    ceiling = ctx.results.get("synthetic_images_per_s")
    rate = run.summary["samples_per_s"]
    share = rate / ceiling if ceiling and rate else None
    judge(sec, "rate / synthetic data's", share, "x", Target(">=", TRAIN_SHARE, "issue 36"),
          f"{rate:,.0f} against {ceiling:,.0f} img/s" if share is not None
          else "no ceiling (the train_synthetic section did not complete)")
    sec.data["synthetic_share"] = share
    enforce(ctx, sec)


# ---------------------------------------------------------------------------- the recipe
def recipe_gpu_section(ctx: Context, sec: Section) -> None:
    """imagenet-train-recipe GPU-placed on DALI, alone: images/s and its share of the anchor's (no target)."""
    batch, count = ctx.sizes.decode_batch, max(1, ctx.sizes.decode_batches // 2)
    started = time.perf_counter()
    loader = default_loader(ctx, batch, RECIPE_SPEC, placement="gpu", backend="dali")
    try:
        timing = timed_epochs(loader, ctx, started, count, min_boundaries=1)
    finally:
        loader.close()
    ran_as_default(ctx, loader)
    images, labels = timing.first
    sec.add_feed(f"{RECIPE_SPEC}, {loader.backend} {loader.plan.placement}-placed, batch {batch}",
                 samples_per_s=timing.images_per_s, stall=None, gpu_util=None, first_batch_s=timing.first_s,
                 note=f"{count} batches after {ctx.sizes.warmup} warm-up, {loader.threads} CPU threads; image "
                      f"{tuple(images.shape[1:])} {images.dtype} on {images.device}, label {tuple(labels.shape[1:])} "
                      f"{labels.dtype} (mixup/cutmix soft targets); no model")
    anchor = ctx.results.get("anchor_images_per_s")
    share = timing.images_per_s / anchor if anchor else None
    sec.add("rate / hand-written DALI's", share, "x",
            "reported, no target: the anchor runs imagenet-train's graph (crop 224, flip, normalize); the recipe adds "
            "TrivialAugmentWide, RandomErasing and mixup/cutmix at crop 176" if anchor
            else "no anchor (the dali_anchor section did not complete)")
    sec.data.update(timing.summary(), anchor_share=share, batch=batch, batches=count, backend=loader.backend,
                    placement=loader.plan.placement)
