"""Does the loader hide behind the training step? Time per batch in a loop whose step leaves the CPU idle.

Each contender (from ``rows.py``: feedfast's default, feedfast with DALI, hand-written DALI,
the torchvision DataLoader recipe) is iterated in a loop whose "step" sleeps S ms, as the host
does while a GPU step runs, for S = 0, 50, 100, 150. A loader that hides behind the step
gives a time per batch of max(S, its own time per batch at S = 0); everything above that is
work the loader does on the training thread (or cannot overlap). Rounds alternate the
contenders, each figure is the median of the rounds.

Target (issue 17): feedfast within 5 % of max(S, its own S = 0 time) at every S; ``next()``
on a ready batch well under a millisecond (its median at S = 150 is printed).

Usage: ``python benchmarks/hide_step.py [--set imagenet|synthetic] [--rounds 3] [--batches 20] [--json out]``
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
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import rows  # noqa: E402


def feedfast_default(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """feedfast.DataLoader on imagenet-train with no backend or device argument (on the CPU: the threaded path)."""
    import feedfast
    from feedfast.baseline.measure import forever

    loader = feedfast.DataLoader(rows.SPEC, shards=shards, batch_size=batch, num_workers=workers)
    print(f"feedfast default: backend {loader.backend}, placement {loader.plan.placement}", file=sys.stderr)
    return forever(loader)


CONTENDERS: dict[str, Callable[[list[str], int, int], Iterator[Any]]] = {
    "feedfast default (auto)": feedfast_default,
    "feedfast backend=dali": rows.feedfast_dali,
    "hand-written DALI (DALIGenericIterator)": rows.hand_dali,
    "torchvision DataLoader": rows.torch_recipe,
}
STEPS_MS = (0, 50, 100, 150)


def timed_loop(it: Iterator[Any], step_ms: float, *, warmup: int, batches: int) -> tuple[float, float]:
    """(ms per batch, median ms inside ``next()``) over ``batches`` iterations of next() + a sleeping step."""
    for _ in range(warmup):
        next(it)
        time.sleep(step_ms / 1000)
    waits = []
    start = time.perf_counter()
    for _ in range(batches):
        t = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t)
        time.sleep(step_ms / 1000)
    return (time.perf_counter() - start) / batches * 1000, statistics.median(waits) * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="imagenet", choices=("imagenet", "synthetic"),
                    help="natural photographs (benchmarks/photos.py) or the synthetic demo set")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", default="", help="comma-separated contender names (substring match)")
    ap.add_argument("--json", default="")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval (s) for this process: how long a thread holds the GIL before "
                         "another may take it (Python's default 0.005)")
    args = ap.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)

    if args.set == "imagenet":
        from photos import photo_dataset

        shards = photo_dataset("imagenet", samples=args.samples, per_shard=256)
    else:
        from feedfast.write.demo import synth_dataset

        shards = synth_dataset(samples=args.samples, per_shard=128)
    names = [n for n in CONTENDERS if not args.only or any(o and o in n for o in args.only.split(","))]
    iters = {n: CONTENDERS[n](shards, args.batch_size, args.workers) for n in names}
    per_batch: dict[tuple[str, int], list[float]] = {}
    in_next: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            for step in STEPS_MS:
                ms, wait = timed_loop(iters[name], step, warmup=args.warmup, batches=args.batches)
                per_batch.setdefault((name, step), []).append(ms)
                in_next.setdefault((name, step), []).append(wait)
                print(f"round {r + 1} {name:42s} step {step:3d} ms: {ms:6.1f} ms/batch (next() {wait:5.1f} ms)",
                      file=sys.stderr, flush=True)
    report = summarize(names, per_batch, in_next, args)
    print(table(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def summarize(names: list[str], per_batch: dict[tuple[str, int], list[float]],
              in_next: dict[tuple[str, int], list[float]], args: argparse.Namespace) -> dict[str, Any]:
    """Medians per (contender, step), the ideal max(S, own) and the excess over it."""
    out: dict[str, Any] = {"date": date.today().isoformat(), "cores": os.cpu_count(), "set": args.set,
                           "batch_size": args.batch_size, "workers": args.workers, "rounds": args.rounds,
                           "batches": args.batches, "rows": {}}
    for name in names:
        own = statistics.median(per_batch[(name, 0)])
        row = {}
        for step in STEPS_MS:
            ms = statistics.median(per_batch[(name, step)])
            ideal = max(step, own)
            row[str(step)] = {"ms_per_batch": round(ms, 1), "ideal": round(ideal, 1),
                              "excess": round(ms / ideal - 1, 3), "next_ms": round(statistics.median(in_next[(name, step)]), 2),
                              "spread": [round(min(per_batch[(name, step)]), 1), round(max(per_batch[(name, step)]), 1)]}
        out["rows"][name] = row
    return out


def table(report: dict[str, Any]) -> str:
    """The report as a Markdown table: ms per batch (excess over max(S, own)) per step."""
    head = "| loop | " + " | ".join(f"step {s} ms" for s in STEPS_MS) + " | next() at 150 ms |"
    lines = [f"{report['date']}, {report['cores']} cores, {report['set']} set, batch {report['batch_size']}, "
             f"{report['workers']} workers, median of {report['rounds']} alternating rounds of {report['batches']} batches",
             "", head, "|" + "---|" * (len(STEPS_MS) + 2)]
    for name, row in report["rows"].items():
        cells = [f"{row[str(s)]['ms_per_batch']:.0f} ({row[str(s)]['excess']:+.0%})" for s in STEPS_MS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['150']['next_ms']:.2f} ms |")
    first = next(iter(report["rows"].values()), None)
    if first is not None:
        worst = max(first[str(s)]["excess"] for s in STEPS_MS)
        lines += ["", f"target (first row within 5% of max(S, own time) at every S): "
                      f"{'met' if worst <= 0.05 else 'not met'} (worst {worst:+.1%})"]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
