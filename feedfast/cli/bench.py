"""``feedfast bench``: throughput of a spec on shards, optionally beside the torch recipe.

With ``--step-ms X`` the consumer simulates a model step of X ms (``time.sleep``, which frees
the core as a GPU step does; see :mod:`feedfast.cli.measure`) and the run reports the stall
that loader would cause at that compute rate and what would remove it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Any

from feedfast._env import usable_cores
from feedfast.cli.advice import step_recommendation
from feedfast.cli.common import check_positive, demo_shards, find_spec, gpu_cell, table, write_json
from feedfast.cli.measure import RunPlan, forever, timed_run
from feedfast.errors import UserError

EXAMPLES = """examples:
  feedfast bench                                   # demo dataset, imagenet-train
  feedfast bench pipelines/imagenet-val.yaml --shards 'data/val-{0000..0063}.tar'
  feedfast bench imagenet-train --shards 'data/*.tar' --threads 2 --compare torch --json out.json
  feedfast bench imagenet-train --step-ms 120 --seconds 20 --plot wait.png   # stall at 120 ms steps
"""

RUN_KEYS = ("samples_per_s", "batches", "samples", "wall_s", "time_to_first_batch_s", "cpu_util", "peak_rss_mb")


def add_parser(sub: Any) -> None:
    """Register ``feedfast bench``."""
    p = sub.add_parser("bench", help="measure a pipeline's throughput", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", default="imagenet-train", help="spec file or shipped pipeline name")
    p.add_argument("--shards", help="shard paths, glob or brace pattern (default: the demo dataset)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None, help="pipeline placement")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--batches", type=int, default=30, help="batches to time after warm-up (default 30)")
    length.add_argument("--seconds", type=float, default=None, help="time this long instead of --batches")
    p.add_argument("--warmup", type=int, default=3, help="batches taken before timing starts (default 3)")
    p.add_argument("--step-ms", type=float, default=None,
                   help="simulate a model step of this many ms per batch (sleep) and report the stall")
    p.add_argument("--plot", default=None, metavar="PATH", help="write a PNG of per-batch wait time")
    p.add_argument("--compare", choices=("torch",), default=None, help="also run the torchvision-style recipe")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="spec override key=value")
    p.add_argument("--on-error", choices=("raise", "skip"), default=None,
                   help="undecodable samples: stop with an error naming them, or skip and count them "
                        "(default: the spec's source.on_error)")
    p.add_argument("--backend", choices=("dali", "pil"), default="dali", help="pipeline backend (default dali)")
    p.add_argument("--json", dest="json_path", default=None,
                   help="write figures as JSON (- for stdout, instead of the table)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """Reject out-of-range numbers and unwritable outputs before anything runs."""
    for name in ("batches", "seconds", "batch_size", "threads", "step_ms"):
        check_positive(name.replace("_", "-"), getattr(args, name))
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        raise UserError(f"--plot {args.plot!r}: its folder does not exist")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table, write JSON (and a plot)."""
    import feedfast

    check_args(args)
    spec_path = find_spec(args.spec)
    shards = args.shards or demo_shards(args.quiet)
    started = time.perf_counter()
    loader = feedfast.DataLoader(spec_path, shards=shards, batch_size=args.batch_size, num_workers=args.threads,
                                 placement=args.device, overrides=args.overrides, on_error=args.on_error,
                                 backend=args.backend)
    step_s = args.step_ms / 1e3 if args.step_ms else None
    plan = RunPlan(warmup=args.warmup, count=args.batches, seconds=args.seconds, step_s=step_s,
                   quiet=args.quiet, label="feedfast")
    try:
        figs, meter = timed_run(forever(loader), plan, started=started)
    finally:
        loader.close()
    res = _result(figs, loader, spec_path)
    if step_s is not None:
        res["step"] = _step(figs, args.step_ms, loader)
    if args.plot:
        res["plot"] = str(meter.plot(args.plot))
    if args.compare == "torch":
        res["compare"] = _compare_torch(loader, plan, args)
        res["compare"]["ratio"] = res["samples_per_s"] / max(res["compare"]["samples_per_s"], 1e-9)
    if args.json_path != "-":  # JSON on stdout stays parseable
        _print(res)
    write_json(args.json_path, res)
    return 0


def _result(figs: dict[str, Any], loader: Any, spec_path: Any) -> dict[str, Any]:
    per_sample = loader.shards.bytes / max(loader.shards.total, 1)
    stats = loader.stats()
    res = {k: figs[k] for k in RUN_KEYS}
    res.update(mb_per_s=figs["samples_per_s"] * per_sample / 1e6, skipped=stats["skipped"], padded=stats["padded"],
               gpu_util=figs["gpu_util"], gpu_status=figs["gpu_status"], spec=str(spec_path),
               placement=loader.plan.placement, threads=loader.threads, batch_size=loader.spec.batch_size,
               shards=len(loader.shards.paths), converted=stats["converted"],
               skipped_samples=loader.skipped_samples()[:1000])  # shard, key, reason; first 1,000
    return res


def _step(figs: dict[str, Any], step_ms: float, loader: Any) -> dict[str, Any]:
    """The ``step`` object: the stall at this compute rate and what removes it."""
    from feedfast._env import cuda_available

    required = loader.spec.batch_size * 1e3 / step_ms
    wait = figs["wait_ms_per_batch"]
    measured = None if figs["batch_ms"] is None or wait is None else figs["batch_ms"] - wait
    achieved = figs["samples_per_s"]
    text, need = step_recommendation(stall_fraction=figs["stall_fraction"], threads=loader.threads, cores=usable_cores(),
                                     required=required, achieved=achieved, placement=loader.plan.placement,
                                     cuda=cuda_available())
    return {"step_ms": step_ms, "simulated_by": "time.sleep in the consumer loop (frees the core, like a GPU step)",
            "stall_fraction": figs["stall_fraction"], "verdict": figs["verdict"],
            "wait_ms_per_batch": figs["wait_ms_per_batch"], "measured_step_ms": measured,
            "required_samples_per_s": required,
            "achieved_samples_per_s": achieved, "threads": loader.threads, "threads_needed": need,
            "cores": usable_cores(), "recommendation": text}


def _compare_torch(loader: Any, plan: RunPlan, args: argparse.Namespace) -> dict[str, Any]:
    from feedfast.baseline.torch_recipe import make_torch_loader

    params = _recipe_params(loader)
    started = time.perf_counter()
    tl = make_torch_loader(list(loader.shards.paths), batch_size=loader.spec.batch_size,
                           num_workers=loader.threads, **params)
    figs, _ = timed_run(forever(tl), dataclasses.replace(plan, label="torch", gpu=False), started=started)
    out = {k: figs[k] for k in RUN_KEYS}
    if plan.step_s is not None:
        out.update(stall_fraction=figs["stall_fraction"], verdict=figs["verdict"])
    out["recipe"] = "webdataset + PIL + RandomResizedCrop/flip or Resize/CenterCrop + Normalize, torch DataLoader"
    return out


def _recipe_params(loader: Any) -> dict[str, Any]:
    """The torch recipe's settings that match the spec's image field."""
    ops = {o.op: o.params for f in loader.spec.fields.values() for o in f.ops}
    if "random_resized_crop" in ops:
        p = ops["random_resized_crop"]
        size = p["size"] if isinstance(p["size"], int) else p["size"][0]
        flip = ops.get("flip", {}).get("horizontal", 0.0)
        return {"train": True, "size": size, "scale": p["scale"], "ratio": p["ratio"], "flip_p": flip}
    if "center_crop" in ops:
        size = ops["center_crop"]["size"]
        resize = ops.get("resize", {}).get("size", 256)
        return {"train": False, "size": size if isinstance(size, int) else size[0],
                "resize": resize if isinstance(resize, int) else resize[0]}
    raise UserError("--compare torch needs an image pipeline with random_resized_crop or center_crop")


def _print(res: dict[str, Any]) -> None:
    rows = [
        ("spec", res["spec"]), ("placement", f"{res['placement']} ({res['threads']} threads)"),
        ("samples/s", f"{res['samples_per_s']:.1f}"), ("MB/s read", f"{res['mb_per_s']:.1f}"),
        ("batches", res["batches"]), ("samples", res["samples"]),
        ("time to first batch", f"{res['time_to_first_batch_s']:.2f} s"),
        ("CPU utilization", f"{res['cpu_util']:.0f} %"),
        ("GPU utilization", gpu_cell(res["gpu_util"], res["gpu_status"])),
        ("peak RSS", f"{res['peak_rss_mb']:.0f} MB"), ("skipped / padded", f"{res['skipped']} / {res['padded']}"),
    ]
    if "step" in res:
        s = res["step"]
        stall = "n/a" if s["stall_fraction"] is None else f"{s['stall_fraction'] * 100:.1f} % ({s['verdict']})"
        rows += [(f"stall at {s['step_ms']:g} ms steps", stall),
                 ("required samples/s", f"{s['required_samples_per_s']:.1f}"), ("to remove it", s["recommendation"])]
    if "compare" in res:
        c = res["compare"]
        rows += [("torch recipe samples/s", f"{c['samples_per_s']:.1f}"),
                 ("ratio feedfast/torch", f"{c['ratio']:.2f}x")]
    if "plot" in res:
        rows.append(("plot", res["plot"]))
    print("feedfast bench\n" + table(rows))
