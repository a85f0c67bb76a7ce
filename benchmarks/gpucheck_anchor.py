"""``gpu_check.py``'s anchor: a hand-written DALI pipeline of imagenet-train's graph on the same shards, the rate every
GPU row is divided by, and the check that ``auto`` never picks the slower placement by a wide margin.

``dali_anchor`` runs :class:`feedfast.baseline.dali_recipe.DaliRecipeLoader` (``fn.readers.webdataset`` shuffled,
``decoders.image_random_crop`` on ``mixed``, ``resize``, ``crop_mirror_normalize``, ``DALIGenericIterator``) at
the decode batch (256 on a GPU), epoch after epoch, timed by :func:`gpucheck_timing.timed_epochs` as
``decode_gpu`` times feedfast's default loader. :func:`anchor_share` then judges that loader against it (issue 36's
"Done when"): its rate at least :data:`ANCHOR_SHARE` of the anchor's, its first batch at most
:data:`FIRST_BATCH_LATE_S` after the anchor's, and its longest epoch boundary at most :data:`BOUNDARY_PERIODS` of
its own batch periods. ``placement`` compares ``loader_gpu`` with ``loader_cpu_cuda``: a GPU-placed loader more
than 10% slower than the CPU-placed one fails (``auto`` picks GPU placement on a GPU machine). In a dry run
everything runs on the CPU, and the targets are reported, not enforced.
"""

from __future__ import annotations

import time

from gpucheck_common import CheckFailed, Context, Section, Skip, Target, judge
from gpucheck_sections import need_shards
from gpucheck_timing import EpochTiming, timed_epochs

ANCHOR_SHARE = 0.9
"""The default GPU-placed loader's rate must be at least this share of the hand-written pipeline's."""
FIRST_BATCH_LATE_S = 1.0
"""Its first batch may come at most this many seconds after the hand-written pipeline's."""
BOUNDARY_PERIODS = 2.0
"""Its longest epoch boundary (an epoch's last batch to the next one's first) in its own median batch periods."""
PLACEMENT_MARGIN = 0.9
"""GPU placement must deliver at least this share of CPU placement's rate, or ``auto`` would pick the slower one."""


def dali_anchor_section(ctx: Context, sec: Section) -> None:
    """The hand-written DALI pipeline: images/s, first batch and epoch boundaries, kept in ``ctx.results`` for
    ``decode_gpu``."""
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
    try:
        timing = timed_epochs(loader, ctx, started, count)
    finally:
        del loader
    rate, first_s, first = timing.images_per_s, timing.first_s, timing.first
    ctx.results.update(anchor_images_per_s=rate, anchor_first_batch_s=first_s)
    if timing.worst_boundary_periods is not None:
        ctx.results["anchor_boundary_periods"] = timing.worst_boundary_periods
    sec.add_feed(f"hand-written DALI ({'mixed' if ctx.cuda else 'cpu'} decode), batch {size}", samples_per_s=rate,
                 stall=None, gpu_util=None, first_batch_s=first_s,
                 note=f"{count} batches after {ctx.sizes.warmup} warm-up, {ctx.threads} DALI threads, "
                      f"{tuple(first[0].shape[1:])} on {first[0].device}; the anchor of the GPU rows")
    sec.add("epoch boundary: worst gap / batch period", timing.worst_boundary_periods, "periods",
            timing.boundary_note() + "; for comparison (no target)")
    sec.data.update(timing.summary(), batch=size, batches=count)


def anchor_share(ctx: Context, sec: Section, timing: EpochTiming) -> None:
    """A feedfast row against the anchor and its own clock, each judged: its share of the anchor's rate (at least
    :data:`ANCHOR_SHARE`), its first batch's lateness (at most :data:`FIRST_BATCH_LATE_S`), its longest epoch
    boundary (at most :data:`BOUNDARY_PERIODS` batch periods)."""
    anchor = ctx.results.get("anchor_images_per_s")
    share = late = None
    why = "no anchor (the dali_anchor section did not complete)"
    if anchor:
        share = timing.images_per_s / anchor
        late = timing.first_s - ctx.results["anchor_first_batch_s"]
        why = ""
    judge(sec, "rate / hand-written DALI's", share, "x", Target(">=", ANCHOR_SHARE, "issue 36"),
          why or f"{timing.images_per_s:,.0f} against {anchor:,.0f} img/s")
    judge(sec, "first batch - hand-written DALI's", late, "s", Target("<=", FIRST_BATCH_LATE_S, "issue 36"),
          why or f"{timing.first_s:.2f} s against {ctx.results['anchor_first_batch_s']:.2f} s")
    anchor_boundary = ctx.results.get("anchor_boundary_periods")
    judge(sec, "epoch boundary: worst gap / batch period", timing.worst_boundary_periods, "periods",
          Target("<=", BOUNDARY_PERIODS, "issue 36"), timing.boundary_note() +
          (f"; hand-written DALI's: {anchor_boundary:.2f} periods" if anchor_boundary is not None else ""))
    sec.data.update(anchor_share=share, anchor_first_batch_late_s=late)


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
