"""``feedfast analyze``: where the input pipeline stalls, fetch or prep, and what would fix it.

Three short runs in the manner of DS-Analyzer, each under a StallMeter and with the same
simulated step (``--step-ms``, a sleep; see :mod:`feedfast.baseline.measure`):

1. synthetic: pre-made tensors of the spec's output shapes, no loader (the compute ceiling);
2. cached: the shards copied into RAM (``/dev/shm``) or the page cache: prep only;
3. cold: the shards as given, after asking the kernel to drop them from the page cache
   (``posix_fadvise``; no root needed): fetch plus prep.

A first, untimed batch from the cached loader pays the process's one-off DALI start-up, so
the runs' times to first batch compare. Prep stall is cached minus synthetic batch time,
fetch stall cold minus cached; the recommendations (:mod:`feedfast.cli.recommend`) are
ranked by the gain the model predicts.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from feedfast._env import usable_cores
from feedfast.baseline.measure import RunPlan, forever, pil_decode_ms, timed_run
from feedfast.cli import analyze_report
from feedfast.cli.advice import MODEL, ReadWindow, Timings, decode_share
from feedfast.cli.common import check_positive, demo_shards, find_spec, write_json
from feedfast.cli.pagecache import drop_cached, stage_in_memory
from feedfast.cli.recommend import Context, crop_area, recommend, target_short_side
from feedfast.cli.shardstats import ShardStats, shard_stats
from feedfast.errors import UserError

EXAMPLES = """examples:
  feedfast analyze                                        # demo dataset, imagenet-train, no step
  feedfast analyze imagenet-train --step-ms 100           # would a 100 ms step stall on this loader?
  feedfast analyze pipelines/imagenet-val.yaml --shards 'data/val-*.tar' --threads 8 --json report.json
"""

DESCRIPTION = """Split input stalls into fetch and prep with three short runs (DS-Analyzer style):
  synthetic  pre-made batches of the spec's output shapes: the compute ceiling
  cached     the shards copied to RAM (/dev/shm) or read into the page cache: prep only
  cold       the shards as given, dropped from the page cache first: fetch plus prep
Each run takes --warmup batches back to back, then times --batches, sleeping --step-ms after
each (a sleep frees the core as a GPU step does). Fixes are ranked by the gain that the
printed model predicts from these measurements."""

DECODE_BENCH_S = 0.5
"""Seconds of the PIL decode micro-benchmark on the sampled images."""


def add_parser(sub: Any) -> None:
    """Register ``feedfast analyze``."""
    p = sub.add_parser("analyze", help="split input stalls into fetch and prep; rank fixes", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=DESCRIPTION)
    p.add_argument("spec", nargs="?", default="imagenet-train", help="spec file or shipped pipeline name")
    p.add_argument("--shards", help="shard paths, glob or brace pattern (default: the demo dataset)")
    p.add_argument("--step-ms", type=float, default=None, help="simulated model step per batch, ms")
    p.add_argument("--batches", type=int, default=10, help="timed batches per run (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches per run (default 3)")
    p.add_argument("--threads", type=int, default=None, help="loader threads (default: all cores)")
    p.add_argument("--batch-size", type=int, default=None, help="samples per batch (default: the spec's batch.size)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None, help="pipeline placement")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="spec override key=value")
    p.add_argument("--json", dest="json_path", default=None,
                   help="write the report as JSON (- for stdout, instead of the text)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the three runs, print the report, write JSON."""
    import feedfast

    for name in ("step_ms", "batches", "threads", "batch_size"):
        check_positive(name.replace("_", "-"), getattr(args, name))
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    spec_path = find_spec(args.spec)
    shards = args.shards or demo_shards(args.quiet)

    def make(paths: Any) -> Any:
        return feedfast.DataLoader(spec_path, shards=paths, batch_size=args.batch_size, num_workers=args.threads,
                                   placement=args.device, overrides=args.overrides)

    cold = make(shards)
    plan = RunPlan(warmup=args.warmup, count=args.batches, step_s=args.step_ms / 1e3 if args.step_ms else None,
                   quiet=args.quiet)
    stats, images = shard_stats(cold.shards.paths, cold.shards.index_paths, _image_exts(cold.spec))
    report = _runs(cold, make, plan)
    report.update(_analysis(report, cold, stats, images, plan))
    report.update(spec=str(spec_path), shards=len(cold.shards.paths), batch_size=cold.spec.batch_size,
                  threads=cold.threads, placement=cold.plan.placement, step_ms=args.step_ms,
                  mode="step" if args.step_ms else "throughput", dataset=stats.to_dict(), model=MODEL)
    if args.json_path != "-":  # JSON on stdout stays parseable
        analyze_report.show(report)
    write_json(args.json_path, report)
    return 0


def _image_exts(spec: Any) -> set[str]:
    return {e.lower() for c in spec.components.values() if c.kind == "image" for e in c.ext.split(";")}


def _runs(cold: Any, make: Any, plan: RunPlan) -> dict[str, Any]:
    """The cached, synthetic and cold runs, in that order (cold last: staging reads the shards)."""
    staged = stage_in_memory(cold.shards.paths, cold.shards.index_paths)
    try:
        cached_loader = make(staged.paths)
        _prime(cached_loader)
        first: list[Any] = []
        cached = _timed(cached_loader, _keep_first(forever(cached_loader), first), plan, "cached")
    finally:
        staged.cleanup()
    cached.update(where=staged.how, resident=staged.resident)
    template = synthetic_batch(cold, first[0])
    synthetic = _timed(None, _repeat(template), plan, "synthetic")
    synthetic["shapes"] = {k: list(v.shape) for k, v in _named(cold, template).items()}
    page_cache = drop_cached(list(cold.shards.paths))
    cold_run = _timed(cold, forever(cold), plan, "cold")
    cold_run["page_cache"] = page_cache
    cold_run["fetch_is_lower_bound"] = not page_cache["cold"]
    return {"runs": {"synthetic": synthetic, "cached": cached, "cold": cold_run}}


def _timed(loader: Any, batches: Any, plan: RunPlan, label: str) -> dict[str, Any]:
    """Time ``batches``; samples/s counts the samples ``loader`` delivered (not its padding), or every row."""
    plan = dataclasses.replace(plan, label=label)
    delivered = None if loader is None else (lambda: int(loader.stats()["delivered"]))
    try:  # a loader starts its pipeline on the first request, so time to first batch counts from now
        figs, _ = timed_run(batches, plan, started=time.perf_counter(), delivered=delivered)
    finally:
        if loader is not None:
            loader.close()
    return figs


def _prime(loader: Any) -> None:
    """Take one batch and stop: the process's first pipeline pays DALI's one-off start-up, untimed."""
    it = iter(loader)
    next(it)
    it.close()
    loader.close()


def _keep_first(batches: Iterator[Any], out: list[Any]) -> Iterator[Any]:
    for batch in batches:
        if not out:
            out.append(batch)
        yield batch


def _repeat(batch: Any) -> Iterator[Any]:
    while True:
        yield batch


def synthetic_batch(loader: Any, like: Any) -> Any:
    """Zero tensors of the plan's output shapes and dtypes; ``like``'s where an extent varies."""
    import torch

    real = _named(loader, like)
    fields = {}
    for name in loader.spec.outputs:
        sig = loader.plan.nodes[loader.plan.outputs[name]].sig
        dtype = getattr(torch, sig.dtype, None)
        known = None not in sig.shape and isinstance(dtype, torch.dtype)
        fields[name] = torch.zeros((real[name].shape[0], *sig.shape), dtype=dtype) if known else real[name].clone()
    return fields if loader.spec.output_form == "dict" else tuple(fields[n] for n in loader.spec.outputs)


def _named(loader: Any, batch: Any) -> dict[str, Any]:
    return dict(batch) if isinstance(batch, dict) else dict(zip(loader.spec.outputs, batch, strict=True))


def _analysis(report: dict[str, Any], loader: Any, stats: ShardStats, images: list[bytes],
              plan: RunPlan) -> dict[str, Any]:
    """Stalls, the decode estimate and the ranked recommendations from the three runs."""
    import psutil

    from feedfast._env import cuda_available

    runs = report["runs"]
    fetch_s, basis = _fetch(loader, runs, plan)
    cached_s = runs["cached"]["batch_ms"] / 1e3
    t = Timings(runs["synthetic"]["batch_ms"] / 1e3, cached_s, cached_s + fetch_s)
    dec_ms = pil_decode_ms(images, seconds=DECODE_BENCH_S) if images else None
    share = decode_share(dec_ms, loader.spec.batch_size, loader.threads, t.prep) if dec_ms is not None else None
    ops = {o.op: o.params for f in loader.spec.fields.values() for o in f.ops}
    ctx = Context(
        batch_size=loader.spec.batch_size, threads=loader.threads, cores=usable_cores(), placement=loader.plan.placement,
        cuda=cuda_available(), passes=tuple(loader.plan.passes),
        crop_area=crop_area(ops["random_resized_crop"]["scale"]) if "random_resized_crop" in ops else None,
        target_short=target_short_side(ops), decode_share=share, sizes=stats.sizes,
        mean_shard_mb=stats.mean_shard_mb, total_mb=stats.total_mb,
        ram_free_mb=psutil.virtual_memory().available / 1e6, cold=not runs["cold"]["fetch_is_lower_bound"],
    )
    stalls: dict[str, Any] = dict(t.stalls())
    stalls.update(_ratios(runs), startup_fetch_s=_startup(runs), fetch_basis=basis,
                  total_stall_fraction=runs["cold"]["stall_fraction"], verdict=runs["cold"]["verdict"],
                  notes=_notes(runs, plan))
    return {"stalls": stalls, "decode": {"pil_ms_per_image": dec_ms, "decode_share_of_prep": share,
                                         "benchmark": f"PIL full decode, 1 thread, {DECODE_BENCH_S} s on the "
                                                      f"{len(images)} sampled images"},
            "recommendations": recommend(t, ctx)}


def _startup(runs: dict[str, Any]) -> float:
    return float(runs["cold"]["time_to_first_batch_s"] - runs["cached"]["time_to_first_batch_s"])


def _fetch(loader: Any, runs: dict[str, Any], plan: RunPlan) -> tuple[float, str]:
    """Fetch seconds per batch, from the steady state or, when the timed batches read nothing, the start-up."""
    window = ReadWindow(epoch_batches=len(loader), batch_size=loader.spec.batch_size,
                        shuffle_buffer=loader.spec.shuffle_buffer or 0, warmup=plan.warmup, batches=plan.count)
    steady = (runs["cold"]["batch_ms"] - runs["cached"]["batch_ms"]) / 1e3
    return window.fetch(steady_s=steady, startup_s=_startup(runs))


def _ratios(runs: dict[str, Any]) -> dict[str, float | None]:
    def ratio(a: str, b: str) -> float | None:
        den = runs[b]["samples_per_s"]
        return runs[a]["samples_per_s"] / den if den else None

    return {"prep_throughput_ratio": ratio("cached", "synthetic"), "fetch_throughput_ratio": ratio("cold", "cached")}


def _notes(runs: dict[str, Any], plan: RunPlan) -> list[str]:
    notes = []
    if runs["cold"]["fetch_is_lower_bound"]:
        notes.append("the shards stayed in the page cache for the cold run (" + runs["cold"]["page_cache"]["method"]
                     + " did not evict them, or residency is unknown): fetch stall is a lower bound")
    if plan.step_s is None:
        notes.append("no --step-ms: stalls are per-batch time differences; the throughput ratios compare "
                     "the cached run with the raw loop and the cold run with the cached one")
    return notes
