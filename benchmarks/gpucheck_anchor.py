"""``gpu_check.py``'s anchor: a hand-written DALI pipeline of imagenet-train's graph on the same shards, the rate every
GPU row is divided by, and the check that ``auto`` never picks the slower placement by a wide margin.

``dali_anchor`` runs :class:`feedfast.baseline.dali_recipe.DaliRecipeLoader` (``fn.readers.webdataset`` shuffled,
``decoders.image_random_crop`` on ``mixed``, ``resize``, ``crop_mirror_normalize``, ``DALIGenericIterator``) at
the decode batch (256 on a GPU), timed as ``decode_gpu`` times feedfast's loader; ``decode_gpu`` then reports
its rate as a share of it (issue 36: at least 0.9) and its first batch against the anchor's. ``placement``
compares ``loader_gpu`` with ``loader_cpu_cuda``: a GPU-placed loader more than 10% slower than the CPU-placed
one fails (``auto`` picks GPU placement on a GPU machine). In a dry run everything runs on the CPU.
"""

from __future__ import annotations

import time

from gpucheck_common import CheckFailed, Context, Section, Skip
from gpucheck_sections import first_and_rate, forever, need_shards

ANCHOR_SHARE = 0.9
"""The default GPU-placed loader's rate must be at least this share of the hand-written pipeline's."""
PLACEMENT_MARGIN = 0.9
"""GPU placement must deliver at least this share of CPU placement's rate, or ``auto`` would pick the slower one."""


def dali_anchor_section(ctx: Context, sec: Section) -> None:
    """The hand-written DALI pipeline: images/s and first batch, kept in ``ctx.results`` for ``decode_gpu``."""
    from feedfast._env import cache_dir
    from feedfast.baseline.dali_recipe import DaliRecipeLoader
    from feedfast.baseline.torch_recipe import TorchRecipe
    from feedfast.shards.index.tarindex import load_index

    paths = ctx.shard_paths or [need_shards(ctx)]
    index_paths = [str(load_index(p, cache_dir())[0]) for p in paths]
    size, count = ctx.sizes.decode_batch, ctx.sizes.decode_batches
    recipe = TorchRecipe(train=True, size=ctx.sizes.image or 224)
    started = time.perf_counter()
    loader = DaliRecipeLoader(paths, index_paths, recipe=recipe, batch_size=size, threads=ctx.threads,
                              device_id=0 if ctx.cuda else None, seed=0, shuffle=True)
    batches = forever(loader)
    try:
        first, first_s, rate = first_and_rate(batches, ctx, started, count)
    finally:
        batches.close()
        del loader
    ctx.results.update(anchor_images_per_s=rate, anchor_first_batch_s=first_s)
    sec.add_feed(f"hand-written DALI ({'mixed' if ctx.cuda else 'cpu'} decode), batch {size}", samples_per_s=rate,
                 stall=None, gpu_util=None, first_batch_s=first_s,
                 note=f"{count} batches after {ctx.sizes.warmup} warm-up, {ctx.threads} DALI threads, "
                      f"{tuple(first[0].shape[1:])} on {first[0].device}; the anchor of the GPU rows")
    sec.data.update(images_per_s=rate, first_batch_s=first_s, batch=size, batches=count)


def anchor_share(ctx: Context, sec: Section, rate: float, first_s: float) -> None:
    """A feedfast row against the anchor: its share of the anchor's rate, and its first batch's lateness."""
    anchor = ctx.results.get("anchor_images_per_s")
    if not anchor:
        sec.add("against hand-written DALI", None, "", "no anchor (the dali_anchor section did not complete)")
        return
    share = rate / anchor
    late = first_s - ctx.results["anchor_first_batch_s"]
    verdict = "meets" if share >= ANCHOR_SHARE else "below"
    sec.add("against hand-written DALI", share, "x", f"{verdict} {ANCHOR_SHARE:g} (issue 36); first batch "
            f"{late:+.2f} s against the anchor's")
    sec.data.update(anchor_share=share, anchor_first_batch_late_s=late, anchor_verdict=verdict)


def placement_section(ctx: Context, sec: Section) -> None:
    """GPU placement against CPU placement, both delivering to ``cuda``: ``auto`` must not pick the slower."""
    gpu, cpu = ctx.results.get("loader_gpu"), ctx.results.get("loader_cpu_cuda")
    if gpu is None or cpu is None:
        raise Skip("loader_gpu and loader_cpu_cuda did not both run")
    share = gpu / cpu
    sec.add("GPU-placed / CPU-placed, to cuda", share, "x", f"{gpu:,.0f} against {cpu:,.0f} images/s")
    sec.data.update(gpu_images_per_s=gpu, cpu_images_per_s=cpu, share=share)
    if share < PLACEMENT_MARGIN:
        raise CheckFailed(f"GPU placement delivers {share:.2f}x CPU placement's rate: auto picks GPU placement on "
                          f"a GPU machine, so it would pick the slower one")
