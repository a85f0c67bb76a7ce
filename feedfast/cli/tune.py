"""``feedfast tune``: run the loader's own search offline and print the settings to paste into a spec.

For each candidate that applies (on the CPU: the threaded path and DALI; with CUDA also DALI
placed on the GPU, with the hardware JPEG decoder's share at 0, NVIDIA's 0.65 and 1; over
remote shards DALI only), a ``DataLoader(tune=True)`` feeds a loop whose step is simulated:
``--step-ms N`` sleeps N ms per batch (a GPU step: the host idles), ``--model small-cnn``
trains a small CNN on the CPU on the loop's thread (a step that needs a core too). Once the search has decided,
``--confirm`` more batches measure the decision's period. The candidate with the shortest
period wins; its settings print as spec keys: a ``loader:`` section (:mod:`feedfast.spec.runtime`),
and ``device`` and ``decoder.hw_decoder_load`` where it is a GPU placement.

The online search (``tune=True`` in training) never changes the backend: the backends draw
their own augmentation, so a switch would change the data. Here the choice is the user's: a
spec with another ``loader.backend`` gives other augmentation draws (same samples and order).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

from feedfast.cli.common import check_positive, demo_shards, find_spec, write_json
from feedfast.errors import UserError

EXAMPLES = """examples:
  feedfast tune                                         # demo dataset, imagenet-train, no step (loader-bound)
  feedfast tune imagenet-train --shards 'data/*.tar' --step-ms 120
  feedfast tune imagenet-train --shards 'data/*.tar' --model small-cnn --json tune.json
"""


def add_parser(sub: Any) -> None:
    """Register ``feedfast tune``."""
    p = sub.add_parser("tune", help="search the loader's settings for a training step and print them as spec keys",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", default="imagenet-train", help="spec file or shipped pipeline name")
    p.add_argument("--shards", help="shard paths, glob or brace pattern (default: the demo dataset)")
    p.add_argument("--batch-size", type=int, default=None, help="samples per batch (default: the spec's batch.size)")
    step = p.add_mutually_exclusive_group()
    step.add_argument("--step-ms", type=float, default=0.0, help="simulated step: sleep this many ms per batch")
    step.add_argument("--model", choices=("small-cnn",), default=None,
                      help="simulated step: train a small CNN on the CPU on each batch")
    p.add_argument("--budget", type=float, default=None,
                   help="share of the first epoch the search may take (default: the spec's tune.budget, 0.1)")
    p.add_argument("--confirm", type=int, default=10, help="batches measured after the decision (default 10)")
    p.add_argument("--backends", default="auto",
                   help="comma-separated backends to compare (default auto: those that apply, and GPU placement "
                        "with CUDA)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None, help="pipeline placement")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="spec override key=value")
    p.add_argument("--json", default=None, metavar="PATH", help="write the trials and decision as JSON")
    p.set_defaults(func=run)


def _step(args: argparse.Namespace) -> Callable[[Any], None]:
    if args.model is None:
        seconds = args.step_ms / 1e3
        return lambda batch: time.sleep(seconds)
    return small_cnn_step()


def small_cnn_step() -> Callable[[Any], None]:
    """A training step of a small real model on the CPU, on the calling thread, for a batch ``(images, labels)``.

    Two strided convolutions and a pooled linear head over 1,000 classes (about 2.5 GFLOP a
    step of 64 at 224 px with its backward pass), SGD, seeded. torch runs it on one intra-op
    thread: the loop's thread, as a GPU loop's thread launching kernels (torch's OpenMP team
    made the step swing tenfold with the machine's load). ``benchmarks/autotune.py`` uses it too.
    """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 1000))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.set_num_threads(1)

    def train(batch: Any) -> None:
        x, y = batch[0], batch[1]
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[1] != 3:
            raise UserError("--model small-cnn needs a spec whose first output is a batch of CHW images "
                            "and second the labels; use --step-ms for others")
        opt.zero_grad()
        x = x.to("cpu", torch.float32)
        torch.nn.functional.cross_entropy(model(x), y.to("cpu").long().remainder(1000)).backward()
        opt.step()
    return train


HW_LOADS = (0.0, 0.65, 1.0)  # the hardware JPEG decoder's share tried on a GPU placement (0.65: NVIDIA's default)


def candidates(requested: str, probe_backend: str, placement: str | None, cuda: bool) -> list[dict[str, Any]]:
    """What to compare: backend, placement and spec overrides per candidate."""
    if requested != "auto":
        return [{"backend": b.strip(), "placement": placement, "overrides": []} for b in requested.split(",")
                if b.strip()]
    out: list[dict[str, Any]] = []
    if cuda and placement in (None, "auto", "gpu"):
        out += [{"backend": "dali", "placement": "gpu", "overrides": [f"decoder.hw_decoder_load={h}"]}
                for h in HW_LOADS]
    if placement != "gpu":
        cpu = ["threads", "dali"] if probe_backend == "threads" or (cuda and placement in (None, "auto")) else ["dali"]
        out += [{"backend": b, "placement": "cpu", "overrides": []} for b in cpu]
    return out


def tune_one(spec: str, shards: str, cand: dict[str, Any], args: argparse.Namespace,
             step: Callable[[Any], None]) -> dict[str, Any]:
    """One candidate's search on the simulated loop, then ``--confirm`` batches at its decision."""
    import feedfast

    overrides = list(args.overrides) + cand["overrides"] + (
        [f"tune.budget={args.budget}"] if args.budget is not None else [])
    from feedfast import _env

    loader = feedfast.DataLoader(spec, shards=shards, batch_size=args.batch_size, shuffle=True,
                                 backend=cand["backend"], placement=cand["placement"], overrides=overrides, tune=True,
                                 device="cuda" if _env.cuda_available() else "cpu")
    periods: list[float] = []
    try:
        last = None
        while len(periods) < args.confirm:
            for batch in loader:
                if loader.tuning()["state"] == "done":
                    now = time.perf_counter()
                    if last is not None:
                        periods.append(now - last)
                    last = now
                    if len(periods) >= args.confirm:
                        break
                step(batch)
        report = loader.tuning()
        return {"backend": loader.backend, "placement": loader.plan.placement, "overrides": cand["overrides"],
                **report, "confirmed_ms": round(statistics.median(periods) * 1e3, 2)}
    finally:
        loader.close()


def run(args: argparse.Namespace) -> int:
    """Run ``feedfast tune``."""
    import feedfast
    from feedfast import _env

    check_positive("--confirm", args.confirm)
    if args.budget is not None and not 0 < args.budget <= 1:
        raise UserError(f"--budget must be a share of the first epoch in (0, 1], got {args.budget}")
    spec = str(find_spec(args.spec))
    shards = args.shards or demo_shards()
    probe = feedfast.DataLoader(spec, shards=shards, batch_size=args.batch_size, placement=args.device,
                                overrides=args.overrides)
    cands = candidates(args.backends, probe.backend, args.device, _env.cuda_available())
    probe.close()
    step = _step(args)
    results = [tune_one(spec, shards, c, args, step) for c in cands]
    best = min(results, key=lambda r: r["confirmed_ms"])
    print(f"step: {'small CNN on the CPU' if args.model else f'{args.step_ms:g} ms sleep'}; "
          f"batch {probe.spec.batch_size}; periods are medians, ms per batch")
    for r in results:
        extra = f", {' '.join(r['overrides'])}" if r["overrides"] else ""
        print(f"\nbackend {r['backend']} ({r['placement']}{extra}): {r['reason']}")
        print("| threads | prefetch | predicted | measured | step | wait | loader CPU |")
        print("|---|---|---|---|---|---|---|")
        for t in r["trials"]:
            predicted = "-" if t["predicted_ms"] is None else f"{t['predicted_ms']:.1f}"
            print(f"| {t['threads']} | {t['prefetch']} | {predicted} | {t['period_ms']:.1f} | {t['step_ms']:.1f} "
                  f"| {t['wait_ms']:.1f} | {t['loader_cpu_ms']:.1f} |")
        print(f"decision measured over {args.confirm} batches: {r['confirmed_ms']:.1f} ms per batch")
    decision = best["decision"]
    print("\n# paste into the spec (chosen: the shortest measured period)")
    print(f"loader:\n  backend: {best['backend']}\n  threads: {decision['threads']}\n  prefetch: {decision['prefetch']}")
    if best["placement"] == "gpu":
        load = best["overrides"][0].split("=", 1)[1]
        print(f"device: gpu\ndecoder:\n  hw_decoder_load: {load}")
    if best["backend"] != probe.backend:
        print(f"# note: backend {best['backend']} draws other augmentation than {probe.backend} (the default here): "
              "same samples and order, other crops and flips; a state taken with one does not resume the other")
    write_json(args.json, {"results": results, "chosen": {"backend": best["backend"], "placement": best["placement"],
                                                          "overrides": best["overrides"], **decision}})
    return 0
