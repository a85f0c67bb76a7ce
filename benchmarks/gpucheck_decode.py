"""``gpu_check.py``'s decode sections: the default loader alone (GPU decode + augment) against one H200's feeding
target and the hand-written DALI anchor, and hardware-decoded pixels against DALI's CPU decode of the same samples.

In a dry run both run on the CPU (DALI CPU-placed), so their plumbing is checked; their rows say so.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from gpucheck_anchor import anchor_share
from gpucheck_common import FEED_TARGET, REPO, CheckFailed, Context, Section, enforce
from gpucheck_default import default_call, default_loader, ran_as_default
from gpucheck_sections import forever, need_shards
from gpucheck_timing import timed_epochs

VAL_SPEC = REPO / "pipelines" / "imagenet-val.yaml"
"""The deterministic recipe (resize, centre crop, normalize): the same pixels whichever decoder runs."""
MEAN_LEVELS = 4.0
"""Largest mean |difference| of one image, in 8-bit levels, between nvJPEG and libjpeg-turbo (IDCTs and chroma
upsampling differ by a level or two)."""
FAR_LEVELS, FAR_SHARE = 32.0, 0.005
"""At most this share of one image's values may differ by more than this many levels; a stream-ordering race
(torchcodec's nvJPEG batched-decode corruption on H100) garbles whole blocks or images and fails both."""
STD_LEVELS = 255 * 0.229
"""One normalized unit in 8-bit levels (the red channel's ImageNet std; the smallest of the three)."""


def gpu_placement(ctx: Context) -> tuple[str, str, str]:
    """(placement, device, what runs) of the sections' "GPU" side: nvJPEG on CUDA, DALI CPU-placed in a dry run."""
    if ctx.cuda:
        return "gpu", "cuda", "DALI GPU-placed (nvJPEG, mixed decoder)"
    return "cpu", "cpu", "DALI CPU-placed (dry run: the plumbing only)"


# ---------------------------------------------------------------------------- (a) the default loader alone
def decode_gpu_section(ctx: Context, sec: Section) -> None:
    """The README's default loader at the anchor's batch, alone (no model): its rate against :data:`FEED_TARGET`, and
    against ``dali_anchor`` its rate, first batch and epoch boundaries (:func:`gpucheck_anchor.anchor_share`)."""
    size, count = ctx.sizes.decode_batch, ctx.sizes.decode_batches
    started = time.perf_counter()
    loader = default_loader(ctx, size)
    try:
        timing = timed_epochs(loader, ctx, started, count)
    finally:
        loader.close()
    ran_as_default(ctx, loader)
    rate, first = timing.images_per_s, timing.first
    share = rate / FEED_TARGET
    verdict = "meets" if share >= 1 else "below"
    sec.add_feed(f"{default_call(ctx, size)}: {loader.backend} {loader.plan.placement}-placed", samples_per_s=rate,
                 stall=None, gpu_util=None, first_batch_s=timing.first_s,
                 note=f"{count} batches after {ctx.sizes.warmup} warm-up, {loader.threads} CPU threads, "
                      f"{tuple(first[0].shape[1:])} {first[0].dtype} on {first[0].device}; no model"
                      + ("" if ctx.cuda else "; dry run: DALI CPU-placed, the plumbing only"))
    sec.add("against one H200's feeding target", share, "x",
            f"{verdict} {FEED_TARGET:,} img/s/GPU (MLPerf Training v4.0, NVIDIA H200 ResNet-50: ~63,400 img/s on 8)"
            + ("" if ctx.cuda else "; a dry run's CPU rate, not a GPU figure"))
    sec.data.update(timing.summary(), target=FEED_TARGET, share_of_target=share, verdict=verdict,
                    placement=loader.plan.placement, backend=loader.backend, batch=size, batches=count)
    anchor_share(ctx, sec, timing)
    enforce(ctx, sec)


# ---------------------------------------------------------------------------- (b) pixels against DALI's CPU decode
def image_differences(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    """Per-image figures of two normalized ``(B, C, H, W)`` batches, in 8-bit levels: the worst image's."""
    diff = (got.float() - want.float()).abs().flatten(1) * STD_LEVELS
    mean = diff.mean(dim=1)
    far = (diff > FAR_LEVELS).float().mean(dim=1)
    return {"mean_levels": float(mean.max()), "far_share": float(far.max()), "max_levels": float(diff.max())}


def pixel_batches(ctx: Context, placement: str, device: str, count: int) -> tuple[list[Any], float, Any]:
    """``count`` batches of the val recipe (images on the host, keys), the rate they came at, and the loader."""
    import feedfast

    loader = feedfast.DataLoader(VAL_SPEC, shards=need_shards(ctx), batch_size=ctx.sizes.batch, placement=placement,
                                 device=device, backend="dali", shuffle=False, timeout=ctx.sizes.loader_timeout,
                                 overrides=["decoder.hw_decoder_load=1.0", *val_overrides(ctx)])
    out = []
    batches = forever(loader)
    try:
        t0, images = time.perf_counter(), 0
        for _ in range(count):
            x, _labels = next(batches)
            images += int(x.shape[0])
            out.append((x.to("cpu", non_blocking=False), [k for _, k in loader.last_origins]))
            ctx.budget.check()
        rate = images / (time.perf_counter() - t0)
    finally:
        batches.close()
        loader.close()
    return out, rate, loader


def val_overrides(ctx: Context) -> list[str]:
    """The val recipe at the run's image size (a dry run's 64 px: resize 73, crop 64)."""
    if not ctx.sizes.image:
        return []
    return [f"pipeline.image[1].size={ctx.sizes.image * 8 // 7}", f"pipeline.image[2].size={ctx.sizes.image}"]


def pixels_hw_section(ctx: Context, sec: Section) -> None:
    """Every measured batch of hardware-decoded images (``hw_decoder_load=1.0``) against DALI's CPU decode of
    the same samples; one image past :data:`MEAN_LEVELS` or :data:`FAR_SHARE` fails the check."""
    placement, device, what = gpu_placement(ctx)
    count = ctx.sizes.pixel_batches
    got, rate, gpu_loader = pixel_batches(ctx, placement, device, count)
    want, _, cpu_loader = pixel_batches(ctx, "cpu", "cpu", count)
    if gpu_loader.plan.placement != placement or cpu_loader.plan.placement != "cpu":
        raise CheckFailed(f"placements ran {gpu_loader.plan.placement} and {cpu_loader.plan.placement}")
    worst = {"mean_levels": 0.0, "far_share": 0.0, "max_levels": 0.0}
    bad = []
    for i, ((x, keys), (rx, rkeys)) in enumerate(zip(got, want)):
        if keys != rkeys or x.shape != rx.shape:
            raise CheckFailed(f"batch {i}: the two runs read other samples or shapes ({keys[:2]} vs {rkeys[:2]})")
        figures = image_differences(x, rx)
        worst = {k: max(worst[k], v) for k, v in figures.items()}
        if figures["mean_levels"] > MEAN_LEVELS or figures["far_share"] > FAR_SHARE:
            bad.append(i)
    images = sum(int(x.shape[0]) for x, _ in got)
    sec.add_feed(f"{what} vs DALI CPU-placed", samples_per_s=rate, stall=None, gpu_util=None, first_batch_s=None,
                 note=f"{count} batches, {images} images of imagenet-val compared; hw_decoder_load=1.0")
    sec.add("worst image: mean |difference|", worst["mean_levels"], "levels", f"limit {MEAN_LEVELS:g} (of 255)")
    sec.add(f"worst image: share of values > {FAR_LEVELS:g} levels off", worst["far_share"], "fraction",
            f"limit {FAR_SHARE:g}; largest single difference {worst['max_levels']:.0f} levels")
    sec.data.update(worst, batches=count, images=images, bad_batches=bad, images_per_s=rate,
                    placement=gpu_loader.plan.placement)
    if bad:
        raise CheckFailed(f"hardware-decoded pixels differ from DALI's CPU decode in batches {bad}: worst mean "
                          f"{worst['mean_levels']:.1f} levels, {worst['far_share']:.2%} of values > {FAR_LEVELS:g} off")
