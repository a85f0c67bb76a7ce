"""Does ``DataLoader(tune=True)`` find the best configuration for the loop it feeds, quickly and at no cost?

One epoch of natural photographs (benchmarks/photos.py, 5,120 JPEGs: 80 batches of 64),
imagenet-train, in a loop whose step is one of:

- ``sleep0``: no step at all (the loader is the bottleneck);
- ``sleep150``: a 150 ms sleep (a GPU step: the host idles, the loader hides behind it);
- ``model``: a small real CNN trained on the CPU (forward, backward, SGD on each batch) on the
  loop's thread (one intra-op thread, as a GPU loop's thread is busy launching kernels), a step
  that needs a core the loader also wants.

For each step, every static configuration of an exhaustive sweep (the threaded CPU path with
1 to cores + 1 threads and 2 or 4 batches ahead, and the DALI CPU backend with its defaults),
the default ``DataLoader`` (no arguments) and the tuned one run one epoch each; rounds
alternate the order; figures are medians of the rounds' epoch times (iteration start to the
last batch, the search included).

Targets (issue 16): the tuned epoch within 5 % of the best static configuration's, its
decision made within the first 10 % of the epoch (batches), and never more than 2 % slower
than the default's.

Usage: ``python benchmarks/autotune.py [--rounds 3] [--samples 5120] [--steps sleep0,sleep150,model] [--json out]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import photos  # noqa: E402

import feedfast  # noqa: E402
from feedfast import _env  # noqa: E402
from feedfast.cli.tune import small_cnn_step  # noqa: E402

SPEC = HERE.parent / "pipelines" / "imagenet-train.yaml"


def make_step(kind: str) -> Callable[[Any], None]:
    """The loop's step for a batch ``(images, labels)``: ``sleepN`` (N ms) or ``model`` (the CLI's small CNN)."""
    if kind.startswith("sleep"):
        seconds = float(kind[len("sleep"):]) / 1e3
        return lambda batch: time.sleep(seconds)
    return small_cnn_step()


def configs(cores: int) -> dict[str, dict[str, Any]]:
    """The sweep: name -> DataLoader arguments."""
    out: dict[str, dict[str, Any]] = {}
    for n in range(1, cores + 2):
        for p in (2, 4):
            out[f"threads={n} prefetch={p}"] = {"backend": "threads", "num_workers": n, "prefetch_factor": p}
    out["dali (defaults)"] = {"backend": "dali"}
    out["default"] = {}
    out["tuned"] = {"tune": True}
    return out


def run_epoch(shards: list[str], kwargs: dict[str, Any], step: Callable[[Any], None], batch: int) -> dict[str, Any]:
    """One epoch: its time, and for a tuned loader the decision and when it was made."""
    loader = feedfast.DataLoader(SPEC, shards=shards, batch_size=batch, shuffle=True, device="cpu", **kwargs)
    t0 = time.perf_counter()
    decided_at = None
    for b in loader:
        step(b)
        if decided_at is None and loader.tuning().get("state") == "done":
            decided_at = loader.tuning()["batches_seen"]
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {"seconds": seconds, "batches": len(loader), "delivered": loader.stats()["delivered"]}
    if kwargs.get("tune"):
        report = loader.tuning()
        out.update(decided_at=decided_at, decision=report["decision"], reason=report["reason"], trials=report["trials"])
    loader.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=5120)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", default="sleep0,sleep150,model")
    ap.add_argument("--only", default="", help="comma-separated configuration names to run (substring match)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    shards = photos.photo_dataset("imagenet", samples=args.samples, per_shard=256)
    cores = _env.usable_cores()
    sweep = configs(cores)
    if args.only:
        keep = args.only.split(",")
        sweep = {k: v for k, v in sweep.items() if any(s in k for s in keep) or k in ("default", "tuned")}
    steps = args.steps.split(",")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {k: [] for k in sweep} for s in steps}
    for r in range(args.rounds):
        names = list(sweep) if r % 2 == 0 else list(reversed(sweep))
        for s in steps:
            step = make_step(s)
            for name in names:
                res = run_epoch(shards, sweep[name], step, args.batch_size)
                runs[s][name].append(res)
                print(f"round {r} {s:9s} {name:22s} {res['seconds']:7.2f} s"
                      + (f"  decided at batch {res['decided_at']}: {res['reason']}" if "reason" in res else ""),
                      file=sys.stderr, flush=True)
    report = summarize(runs, args, cores)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]], args: argparse.Namespace, cores: int) -> dict[str, Any]:
    """Medians per step and configuration, the best static one, and the targets."""
    out: dict[str, Any] = {"date": date.today().isoformat(), "cores": cores, "samples": args.samples,
                           "batch_size": args.batch_size, "rounds": args.rounds, "load": os.getloadavg(), "steps": {}}
    for s, by_name in runs.items():
        med = {name: statistics.median(r["seconds"] for r in rs) for name, rs in by_name.items()}
        static = {k: v for k, v in med.items() if k not in ("default", "tuned")}
        best = min(static, key=static.__getitem__)
        tuned = by_name["tuned"]
        batches = tuned[0]["batches"]
        decided = [r["decided_at"] for r in tuned]
        out["steps"][s] = {
            "median_seconds": med, "rounds_seconds": {k: [round(r["seconds"], 2) for r in rs] for k, rs in by_name.items()},
            "best_static": best, "tuned_vs_best": med["tuned"] / med[best], "tuned_vs_default": med["tuned"] / med["default"],
            "decided_at": decided, "batches": batches, "decisions": [r["decision"] for r in tuned],
            "reasons": [r["reason"] for r in tuned], "trials": [r["trials"] for r in tuned],
            "met": {"within 5% of best static": med["tuned"] <= 1.05 * med[best],
                    "decided within 10% of the epoch": all(d is not None and d <= 0.1 * batches for d in decided),
                    "at most 2% slower than default": med["tuned"] <= 1.02 * med["default"]},
        }
    return out


def table(report: dict[str, Any]) -> str:
    """Markdown: epoch seconds per configuration and step, then the targets."""
    steps = list(report["steps"])
    names = list(report["steps"][steps[0]]["median_seconds"])
    lines = ["| configuration | " + " | ".join(f"{s} (s)" for s in steps) + " |",
             "|---|" + "---|" * len(steps)]
    for name in names:
        cells = []
        for s in steps:
            st = report["steps"][s]
            v = st["median_seconds"][name]
            cells.append(f"**{v:.2f}**" if name == st["best_static"] else f"{v:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| step | best static | tuned / best | tuned / default | decided at batch (of) | decision |",
              "|---|---|---|---|---|---|"]
    for s in steps:
        st = report["steps"][s]
        decisions = ", ".join(f"t{d['threads']}p{d['prefetch']}" for d in st["decisions"])
        met = st["met"]
        lines.append(f"| {s} | {st['best_static']} | {st['tuned_vs_best']:.3f} ({'met' if met['within 5% of best static'] else 'not met'}) "
                     f"| {st['tuned_vs_default']:.3f} ({'met' if met['at most 2% slower than default'] else 'not met'}) "
                     f"| {st['decided_at']} ({st['batches']}; {'met' if met['decided within 10% of the epoch'] else 'not met'}) "
                     f"| {decisions} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
