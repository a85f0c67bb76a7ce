"""``feedfast bench``: throughput of a spec on shards, optionally beside the torch recipe."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Iterable

import psutil

from feedfast.cli.common import demo_shards, find_spec, table, write_json
from feedfast.errors import UserError

EXAMPLES = """examples:
  feedfast bench                                   # demo dataset, imagenet-train
  feedfast bench pipelines/imagenet-val.yaml --shards 'data/val-{0000..0063}.tar'
  feedfast bench imagenet-train --shards 'data/*.tar' --threads 2 --compare torch --json out.json
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure a pipeline's throughput", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", default="imagenet-train", help="spec file or shipped pipeline name")
    p.add_argument("--shards", help="shard paths, glob or brace pattern (default: the demo dataset)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None, help="pipeline placement")
    p.add_argument("--batches", type=int, default=30, help="batches to time after warm-up")
    p.add_argument("--seconds", type=float, default=None, help="time this long instead of --batches")
    p.add_argument("--warmup", type=int, default=3, help="batches before timing starts")
    p.add_argument("--compare", choices=("torch",), default=None, help="also run the torchvision-style recipe")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="spec override key=value")
    p.add_argument("--json", dest="json_path", default=None, help="write figures as JSON (- for stdout)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _positive(name: str, v: float | None) -> None:
    if v is not None and v <= 0:
        raise UserError(f"--{name} must be > 0, got {v}")


def measure(batches: Iterable[Any], *, warmup: int, count: int, seconds: float | None, quiet: bool,
            label: str, started: float) -> dict[str, Any]:
    """Time an iterable of (images, ...) batches; warm-up batches are not timed."""
    from tqdm import tqdm

    proc = psutil.Process()
    proc.cpu_percent(None)
    bar = tqdm(total=None if seconds else count, desc=label, unit="batch", disable=quiet, file=sys.stderr)
    it = iter(batches)
    first = None
    samples = n = 0
    t0 = time.perf_counter()
    cpu0 = _tree_cpu(proc)
    while True:
        if seconds is None and n >= count or seconds is not None and n and time.perf_counter() - t0 >= seconds:
            break
        batch = next(it)
        if first is None:
            first = time.perf_counter() - started
        if warmup > 0:
            warmup -= 1
            t0, cpu0 = time.perf_counter(), _tree_cpu(proc)
            continue
        n += 1
        samples += int(batch[0].shape[0]) if isinstance(batch, (tuple, list)) else int(next(iter(batch.values())).shape[0])
        bar.update(1)
    wall = time.perf_counter() - t0
    bar.close()
    cpu = (_tree_cpu(proc) - cpu0) / wall / psutil.cpu_count() * 100 if wall > 0 else 0.0
    return {"samples_per_s": samples / wall if wall else 0.0, "batches": n, "samples": samples, "wall_s": wall,
            "time_to_first_batch_s": first, "cpu_util": round(cpu, 1),
            "peak_rss_mb": round(_peak_rss_mb(proc), 1)}


def _tree_cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def _peak_rss_mb(proc: psutil.Process) -> float:
    import resource

    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(peak_kb, children) / 1024.0


def _forever(loader: Any) -> Iterable[Any]:
    while True:
        yield from loader


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table, write JSON."""
    import feedfast
    from feedfast.sources.shardlist import resolve_shards

    for name in ("batches", "seconds", "batch_size", "threads"):
        _positive(name.replace("_", "-"), getattr(args, name))
    spec_path = find_spec(args.spec)
    shards = args.shards or demo_shards(args.quiet)
    started = time.perf_counter()
    loader = feedfast.DataLoader(spec_path, shards=shards, batch_size=args.batch_size, num_workers=args.threads,
                                 placement=args.device, overrides=args.overrides)
    res = measure(_forever(loader), warmup=args.warmup, count=args.batches, seconds=args.seconds,
                  quiet=args.quiet, label="feedfast", started=started)
    per_sample = loader.shards.bytes / max(loader.shards.total, 1)
    res.update(mb_per_s=res["samples_per_s"] * per_sample / 1e6, **{k: v for k, v in loader.stats().items()
               if k in ("skipped", "padded")}, spec=str(spec_path), placement=loader.plan.placement,
               threads=loader.threads, batch_size=loader.spec.batch_size, shards=len(loader.shards.paths))
    loader.close()
    if args.compare == "torch":
        res["compare"] = _compare_torch(loader, resolve_shards(shards), args)
        res["compare"]["ratio"] = res["samples_per_s"] / max(res["compare"]["samples_per_s"], 1e-9)
    _print(res)
    write_json(args.json_path, res)
    return 0


def _compare_torch(loader: Any, paths: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from feedfast.baseline.torch_recipe import make_torch_loader

    params = _recipe_params(loader)
    started = time.perf_counter()
    tl = make_torch_loader(paths, batch_size=loader.spec.batch_size, num_workers=loader.threads, **params)
    out = measure(_forever(tl), warmup=args.warmup, count=args.batches, seconds=args.seconds,
                  quiet=args.quiet, label="torch", started=started)
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
        ("time to first batch", f"{res['time_to_first_batch_s']:.2f} s"), ("CPU utilization", f"{res['cpu_util']:.0f} %"),
        ("peak RSS", f"{res['peak_rss_mb']:.0f} MB"), ("skipped / padded", f"{res['skipped']} / {res['padded']}"),
    ]
    if "compare" in res:
        c = res["compare"]
        rows += [("torch recipe samples/s", f"{c['samples_per_s']:.1f}"), ("ratio feedfast/torch", f"{c['ratio']:.2f}x")]
    print("feedfast bench\n" + table(rows))
