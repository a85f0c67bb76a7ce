"""Ranked recommendations for ``feedfast analyze``, each with the gain the model predicts.

Every candidate is scored with :class:`feedfast.cli.advice.Timings` (the model is
:data:`feedfast.cli.advice.MODEL`); candidates that do not apply are kept, unranked, with
the reason, so the output says why "GPU decode" or "ROI decode" is not on the list.

The ranking is by the gain the run's own figures support (see :func:`recommend`): decode
gains stand on the share of prep the plan spends decoding (the crops only, when the plan
decodes regions), and a change this machine cannot make (GPU decode without a GPU) is
listed with its gain elsewhere but not ranked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from feedfast.cli.advice import Timings, speedup_from_decode

MIN_GAIN = 1.02
"""Predicted speed-ups below this rank as "no gain" rather than as a recommendation."""
SHARD_MB_LOW, SHARD_MB_HIGH = 100.0, 1000.0
"""The shard size range WebDataset's authors recommend (MB)."""


@dataclass(frozen=True)
class Context:
    """What the recommendations need besides the timings.

    Attributes:
        batch_size: samples per batch.
        threads: loader threads used in the runs.
        cores: cores this process may use.
        placement: ``cpu`` or ``gpu``.
        cuda: whether this machine has a usable GPU.
        passes: the plan's passes (``fuse:decode+random_resized_crop@...`` when fused).
        crop_area: mean area fraction of the spec's random_resized_crop (None: none in spec).
        target_short: the shorter side the spec needs (None: unknown).
        decode_share: estimated share of prep spent decoding (None: no images sampled).
        sizes: sampled images' (width, height).
        mean_shard_mb, total_mb, ram_free_mb: shard and memory sizes.
        cold: whether the cold run really read from storage.
    """

    batch_size: int
    threads: int
    cores: int
    placement: str
    cuda: bool
    passes: tuple[str, ...]
    crop_area: float | None
    target_short: int | None
    decode_share: float | None
    sizes: tuple[tuple[int, int], ...]
    mean_shard_mb: float
    total_mb: float
    ram_free_mb: float
    cold: bool


def pixel_ratio(sizes: tuple[tuple[int, int], ...], target_short: int) -> float:
    """Mean fraction of pixels kept when images are re-encoded to ``target_short`` on the shorter side."""
    if not sizes:
        return 1.0
    return sum(min(1.0, (target_short / min(w, h)) ** 2) for w, h in sizes) / len(sizes)


def _item(t: Timings, ctx: Context, action: str, why: str, *, prep: float = 1.0, fetch: float = 1.0,
          here: bool = True) -> dict[str, Any]:
    batch_s, stall = t.predict(prep_speedup=prep, fetch_scale=fetch)
    return {"action": action, "applicable": True, "here": here, "predicted_speedup": t.speedup(
        prep_speedup=prep, fetch_scale=fetch), "predicted_loader_speedup": t.loader_speedup(
        prep_speedup=prep, fetch_scale=fetch), "predicted_stall_fraction": stall,
        "predicted_samples_per_s": ctx.batch_size / batch_s if batch_s > 0 else None, "why": why}


def _skip(action: str, why: str) -> dict[str, Any]:
    return {"action": action, "applicable": False, "here": False, "predicted_speedup": None,
            "predicted_loader_speedup": None, "predicted_stall_fraction": None, "predicted_samples_per_s": None,
            "why": why}


def _fused(ctx: Context) -> str | None:
    """The plan's decode + random_resized_crop fusion pass, if it ran."""
    return next((p for p in ctx.passes if p.startswith("fuse:decode+random_resized_crop")), None)


def plan_decode_share(ctx: Context) -> float | None:
    """The share of prep the plan spends decoding.

    ``ctx.decode_share`` is measured on whole images; a plan that decodes regions (fused
    with random_resized_crop) decodes about the mean crop area of them, and by the model
    decode cost scales with decoded pixels.
    """
    if ctx.decode_share is None:
        return None
    if _fused(ctx) and ctx.crop_area is not None:
        return ctx.decode_share * ctx.crop_area
    return ctx.decode_share


def _decode_words(ctx: Context) -> str:
    share = plan_decode_share(ctx)
    if share == ctx.decode_share:
        return f"decode is {share:.0%} of prep"
    return (f"decode is {share:.0%} of prep ({ctx.decode_share:.0%} for whole images; the plan decodes crops of "
            f"{ctx.crop_area:.0%} of the area)")


def _threads(t: Timings, ctx: Context) -> dict[str, Any]:
    action = f"more threads (--threads {ctx.cores})"
    if ctx.threads >= ctx.cores:
        return _skip("more threads", f"all {ctx.cores} cores already in use (threads={ctx.threads})")
    k = ctx.cores / ctx.threads
    return _item(t, ctx, action, f"prep x{k:.2f} (threads {ctx.threads} -> {ctx.cores}, linear scaling)", prep=k)


def _gpu_decode(t: Timings, ctx: Context) -> dict[str, Any]:
    share = plan_decode_share(ctx)
    if ctx.placement == "gpu":
        return _skip("GPU decode", "the plan already decodes on the GPU (placement gpu)")
    if share is None:
        return _skip("GPU decode", "no images sampled: decode share unknown")
    k = speedup_from_decode(share, 0.0)
    where = "" if ctx.cuda else " (needs a GPU; none on this machine)"
    return _item(t, ctx, "GPU decode (--device gpu)" + where,
                 f"CPU decode moves to nvJPEG: {_decode_words(ctx)} (augmentations move too, not counted: a lower "
                 "bound), if the GPU's decoder keeps up (not measured here)", prep=k, here=ctx.cuda)


def _roi_decode(t: Timings, ctx: Context) -> dict[str, Any]:
    fused = _fused(ctx)
    if fused:
        return _skip("region-of-interest decode", f"already fused by the plan ({fused})")
    if ctx.crop_area is None:
        return _skip("region-of-interest decode", "the spec has no random_resized_crop right after decode")
    if ctx.decode_share is None:
        return _skip("region-of-interest decode", "no images sampled: decode share unknown")
    k = speedup_from_decode(ctx.decode_share, ctx.crop_area)
    return _item(t, ctx, "region-of-interest decode (decode -> random_resized_crop, one consumer)",
                 f"decode keeps {ctx.crop_area:.0%} of its pixels on average (mean crop area)", prep=k)


def _reencode(t: Timings, ctx: Context) -> dict[str, Any]:
    action = "re-encode smaller images"
    if ctx.target_short is None or not ctx.sizes or ctx.decode_share is None:
        return _skip(action, "no image sizes sampled or no resize/crop size in the spec")
    ratio = pixel_ratio(ctx.sizes, ctx.target_short)
    if ratio > 0.9:
        return _skip(action, f"images are already close to a {ctx.target_short} px shorter side")
    k = speedup_from_decode(plan_decode_share(ctx) or 0.0, ratio)
    return _item(t, ctx, f"{action} (shorter side {ctx.target_short} px)",
                 f"decode and bytes scale to {ratio:.0%} of now (pixels kept; {_decode_words(ctx)}); train crops "
                 "then come from lower-resolution images", prep=k, fetch=ratio)


def _cache(t: Timings, ctx: Context) -> dict[str, Any]:
    fits = ctx.total_mb < 0.5 * ctx.ram_free_mb
    room = (f"the shards ({ctx.total_mb:.0f} MB) fit in RAM ({ctx.ram_free_mb:.0f} MB free): page cache or /dev/shm"
            if fits else f"the shards ({ctx.total_mb:.0f} MB) do not fit in half the free RAM: use local NVMe")
    bound = "" if ctx.cold else "; fetch was measured from the page cache, so this gain is a lower bound"
    return _item(t, ctx, "cache shards in memory or on local NVMe", f"fetch time removed; {room}{bound}",
                 fetch=0.0, here=fits)


def _shard_size(t: Timings, ctx: Context) -> dict[str, Any]:
    action = "resize shards"
    if ctx.mean_shard_mb < SHARD_MB_LOW:
        return _item(t, ctx, f"larger shards ({ctx.mean_shard_mb:.1f} MB now; aim for 100 MB to 1 GB)",
                     "fewer opens and longer sequential reads; upper bound: all fetch time removed", fetch=0.0)
    if ctx.mean_shard_mb > SHARD_MB_HIGH:
        return _skip(action, f"shards average {ctx.mean_shard_mb:.0f} MB: larger ones would not read faster "
                             "(smaller ones shuffle and resume at a finer grain)")
    return _skip(action, f"shards average {ctx.mean_shard_mb:.0f} MB, inside 100 MB to 1 GB")


CANDIDATES = (_threads, _gpu_decode, _roi_decode, _reencode, _cache, _shard_size)


def _rank_key(item: dict[str, Any]) -> tuple[float, float, bool]:
    """Predicted speed-up first; among equal ones (a step-bound run caps them all), the loader's own gain."""
    return (-round(item["predicted_speedup"], 9), -round(item["predicted_loader_speedup"], 9), not item["here"])


def recommend(t: Timings, ctx: Context) -> list[dict[str, Any]]:
    """Every candidate, ranked: applicable ones by predicted speed-up (``rank`` 1, 2, ...), then the rest.

    Equal speed-ups (the model caps every gain at the step's time) rank by
    ``predicted_loader_speedup``, how much faster the loader alone gets: the headroom left.
    A candidate predicting under :data:`MIN_GAIN` keeps ``rank`` None with ``why`` saying so;
    so does one that needs a GPU this machine has not (its ``predicted_speedup`` is the gain
    on a machine with one).
    """
    items = [make(t, ctx) for make in CANDIDATES]
    for it in items:
        if it["applicable"] and it["predicted_speedup"] < MIN_GAIN:
            it["applicable"] = False
            it["why"] = f"no predicted gain (x{it['predicted_speedup']:.2f}): {it['why']}"
        elif it["applicable"] and it["action"].startswith("GPU decode") and not ctx.cuda:
            it["applicable"] = False
            it["why"] = f"not ranked: no GPU on this machine; on one, x{it['predicted_speedup']:.2f}: {it['why']}"
    ranked = sorted((i for i in items if i["applicable"]), key=_rank_key)
    for n, it in enumerate(ranked, 1):
        it["rank"] = n
    rest = [dict(i, rank=None) for i in items if not i["applicable"]]
    return ranked + rest


def crop_area(scale: Any) -> float:
    """Mean area fraction of a random_resized_crop with ``scale`` [lo, hi] (area uniform in it)."""
    lo, hi = (float(scale[0]), float(scale[1])) if isinstance(scale, (list, tuple)) else (float(scale),) * 2
    return (lo + hi) / 2


def target_short_side(ops: dict[str, dict[str, Any]]) -> int | None:
    """The shorter side a spec needs: ``resize``'s size, or 8/7 of a random crop's (256 for 224)."""
    def side(v: Any) -> int:
        return int(v) if isinstance(v, (int, float)) else int(min(v))

    if "resize" in ops:
        return side(ops["resize"]["size"])
    if "random_resized_crop" in ops:
        return math.ceil(side(ops["random_resized_crop"]["size"]) * 8 / 7)
    return None
