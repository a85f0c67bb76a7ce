"""``feedfast bench``: throughput of a spec on shards, optionally beside a baseline.

With ``--step-ms X`` the consumer simulates a model step of X ms (``time.sleep``, which frees
the core as a GPU step does; see :mod:`feedfast.baseline.measure`) and the run reports the stall
that loader would cause at that compute rate and what would remove it.

With ``--compare torch`` (torchvision's transforms in a torch DataLoader) or ``--compare dali``
(a hand-written DALI pipeline), both loaders read the same shards and samples with the same
batch size and worker count. ``--rounds`` rounds time each loader in alternating order
(:mod:`feedfast.baseline.rounds`), and the median per-round ratio is printed with its spread.

Every round is timed as ``make bench`` times it, by the same function
(:func:`feedfast.baseline.timing.time_round`): it builds a new loader (feedfast's with the
arguments given here, the baseline from it), takes ``--warmup`` batches untimed, times
``--batches`` batches (or ``--seconds``), and closes the loader before the next round starts.
So each loader is timed alone, on batches of its first epoch when warm-up and timed batches
fit in one, and no round runs while another loader refills its queue or starts its next
epoch ahead. CPU and memory figures count this process and its child processes (the round's
workers). Time to first batch is the first round's, from the loader's construction.
Without ``--compare`` one loader is timed (``--rounds``: one new loader per round).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from feedfast._env import usable_cores
from feedfast.baseline.measure import RunPlan, combine_runs
from feedfast.baseline.rounds import ratio_spread, round_order
from feedfast.baseline.timing import samples_per_cpu_s, time_round
from feedfast.cli.advice import step_recommendation
from feedfast.cli.common import check_positive, demo_shards, find_spec, gpu_cell, table, write_json
from feedfast.errors import UserError
from feedfast.spec.runtime import BACKENDS

if TYPE_CHECKING:
    from feedfast.baseline.contenders import Contender

EXAMPLES = """examples:
  feedfast bench                                   # demo dataset, imagenet-train
  feedfast bench pipelines/imagenet-val.yaml --shards 'data/val-{0000..0063}.tar'
  feedfast bench imagenet-train --shards 'data/*.tar' --threads 2 --compare torch --json out.json
  feedfast bench imagenet-train --compare dali --rounds 7 --batches 20   # beside a hand-written DALI pipeline
  feedfast bench imagenet-train --step-ms 120 --seconds 20 --plot wait.png   # stall at 120 ms steps
"""

RUN_KEYS = ("samples_per_s", "batches", "samples", "wall_s", "time_to_first_batch_s", "cpu_util", "peak_rss_mb")


def add_parser(sub: Any) -> None:
    """Register ``feedfast bench``."""
    p = sub.add_parser("bench", help="measure a pipeline's throughput", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", default="imagenet-train", help="spec file or shipped pipeline name")
    p.add_argument("--shards", help="shard paths, glob or brace pattern (default: the demo dataset)")
    p.add_argument("--batch-size", type=int, default=None, help="samples per batch (default: the spec's batch.size)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None, help="pipeline placement")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--batches", type=int, default=30, help="batches to time per round, after warm-up (default 30)")
    length.add_argument("--seconds", type=float, default=None, help="time this long per round instead of --batches")
    p.add_argument("--warmup", type=int, default=3, help="batches taken before each round's timing starts (default 3)")
    p.add_argument("--step-ms", type=float, default=None,
                   help="simulate a model step of this many ms per batch (sleep) and report the stall")
    p.add_argument("--plot", default=None, metavar="PATH", help="write a PNG of per-batch wait time")
    p.add_argument("--compare", choices=("torch", "dali"), default=None,
                   help="also time a baseline on the same shards: torchvision's transforms in a torch DataLoader "
                        "(torch), or a hand-written DALI pipeline (dali)")
    p.add_argument("--rounds", type=int, default=None,
                   help="timed rounds per loader, in alternating order, each on a new loader "
                        "(default 5 with --compare, else 1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="spec override key=value")
    p.add_argument("--on-error", choices=("raise", "skip"), default=None,
                   help="undecodable samples: stop with an error naming them, or skip and count them "
                        "(default: the spec's source.on_error)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="pipeline backend (default auto: what feedfast.DataLoader picks for the plan)")
    p.add_argument("--json", dest="json_path", default=None,
                   help="write figures as JSON (- for stdout, instead of the table)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """Reject out-of-range numbers and unwritable outputs before anything runs."""
    for name in ("batches", "seconds", "batch_size", "threads", "step_ms", "rounds"):
        check_positive(name.replace("_", "-"), getattr(args, name))
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        raise UserError(f"--plot {args.plot!r}: its folder does not exist")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table, write JSON (and a plot)."""
    import feedfast
    from feedfast.baseline.contenders import check_baseline, feedfast_contender, make_baseline  # torch: run only

    check_args(args)
    spec_path = find_spec(args.spec)
    shards = args.shards or demo_shards(args.quiet)

    def build() -> Any:
        return feedfast.DataLoader(spec_path, shards=shards, batch_size=args.batch_size, num_workers=args.threads,
                                   placement=args.device, overrides=args.overrides, on_error=args.on_error,
                                   backend=args.backend)

    loader = build()  # checks the arguments before any round; never iterated, each round times a new one
    if args.compare:
        check_baseline(args.compare, loader)
    step_s = args.step_ms / 1e3 if args.step_ms else None
    plan = RunPlan(warmup=args.warmup, count=args.batches, seconds=args.seconds, step_s=step_s,
                   quiet=args.quiet, label="feedfast")
    counts: list[dict[str, Any]] = []  # each feedfast round's stats, read once its loader is closed
    recipes: dict[str, str] = {}

    def round_loader(name: str) -> Contender:
        if name == "feedfast":
            return feedfast_contender(build(), closed=lambda done: counts.append(_counts(done)))
        baseline = make_baseline(name, loader)
        recipes[name] = baseline.recipe
        return baseline

    names = ["feedfast", *([args.compare] if args.compare else [])]
    try:
        runs, meter = _rounds(names, round_loader, plan, args.rounds or (5 if args.compare else 1))
    finally:
        loader.close()
    res = _result(runs["feedfast"], loader, spec_path, counts)
    if step_s is not None:
        res["step"] = _step(res, args.step_ms, loader)
    if args.plot:
        res["plot"] = str(meter.plot(args.plot))
    if args.compare:
        res["compare"] = compare_figures(args.compare, recipes[args.compare], runs, step=step_s is not None)
    if args.json_path != "-":  # JSON on stdout stays parseable
        _print(res)
    write_json(args.json_path, res)
    return 0


def _rounds(names: list[str], make: Callable[[str], Any], plan: RunPlan,
            rounds: int) -> tuple[dict[str, dict[str, Any]], Any]:
    """Each contender's figures over ``rounds`` alternating rounds, and feedfast's last round's meter.

    In each round, each of ``names`` in :func:`round_order`'s order is built (``make(name)``),
    timed and closed (:func:`time_round`) before the next one is built.
    """
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    meter = None
    for number, order in enumerate(round_order(names, rounds)):
        for name in order:
            label = name if rounds == 1 else f"{name} {number + 1}/{rounds}"
            figs, run_meter = time_round(functools.partial(make, name), dataclasses.replace(plan, label=label))
            figures[name].append(figs)
            meter = run_meter if name == "feedfast" else meter
    return {name: {**combine_runs(runs), "warmup_per_round": plan.warmup} for name, runs in figures.items()}, meter


def _counts(loader: Any) -> dict[str, Any]:
    """What a closed feedfast loader counted: its ``stats()`` and the samples it left out."""
    return {**loader.stats(), "skipped_samples": loader.skipped_samples()[:1000]}  # shard, key, reason; first 1,000


def _result(figs: dict[str, Any], loader: Any, spec_path: Any, counts: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of feedfast's rounds; padding added up over the rounds' loaders, what the dataset
    left out (the same for each) from the last."""
    per_sample = loader.shards.bytes / max(loader.shards.total, 1)
    last = counts[-1]
    res = {k: figs[k] for k in (*RUN_KEYS, "rounds", "round_samples_per_s", "warmup_per_round", "cpu_s",
                                "batch_ms", "wait_ms_per_batch", "stall_fraction", "verdict")}
    res.update(mb_per_s=figs["samples_per_s"] * per_sample / 1e6, skipped=last["skipped"],
               padded=sum(c["padded"] for c in counts),
               gpu_util=figs["gpu_util"], gpu_status=figs["gpu_status"], spec=str(spec_path),
               placement=loader.plan.placement, backend=loader.backend, threads=loader.threads, batch_size=loader.spec.batch_size,
               shards=len(loader.shards.paths), converted=last["converted"], skipped_samples=last["skipped_samples"])
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


def compare_figures(baseline: str, recipe: str, runs: dict[str, dict[str, Any]], *, step: bool) -> dict[str, Any]:
    """The ``compare`` object: the baseline's figures and the median feedfast/baseline ratio with its spread."""
    base = runs[baseline]
    spread = ratio_spread(runs["feedfast"]["round_samples_per_s"], base["round_samples_per_s"])
    out = {k: base[k] for k in (*RUN_KEYS, "rounds", "round_samples_per_s", "warmup_per_round", "cpu_s")}
    per_cpu = {name: samples_per_cpu_s(runs[name]) for name in ("feedfast", baseline)}
    mine, theirs = per_cpu["feedfast"], per_cpu[baseline]
    out.update(baseline=baseline, recipe=recipe, ratio=spread.median, ratio_spread=spread.to_dict(),
               ratio_spread_text=spread.text(), samples_per_cpu_s=per_cpu,
               ratio_per_cpu_s=mine / theirs if mine is not None and theirs else None,
               order=[list(order) for order in round_order(["feedfast", baseline], base["rounds"])])
    if step:
        out.update(stall_fraction=base["stall_fraction"], verdict=base["verdict"])
    return out


def _print(res: dict[str, Any]) -> None:
    rows = [
        ("spec", res["spec"]), ("placement", f"{res['placement']}, {res['backend']} backend ({res['threads']} threads)"),
        ("samples/s", _rate(res)), ("MB/s read", f"{res['mb_per_s']:.1f}"),
        ("batches", res["batches"]), ("samples delivered", res["samples"]),
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
        rows += _compare_rows(res["compare"])
    if "plot" in res:
        rows.append(("plot", res["plot"]))
    print("feedfast bench\n" + table(rows))


def _per_cpu_text(c: dict[str, Any]) -> str:
    """``"2.03x (feedfast 465, torch 229 samples per CPU s)"``, or why there is none."""
    if c["ratio_per_cpu_s"] is None:
        return "n/a (no CPU time measured)"
    mine, theirs = c["samples_per_cpu_s"]["feedfast"], c["samples_per_cpu_s"][c["baseline"]]
    return f"{c['ratio_per_cpu_s']:.2f}x (feedfast {mine:.0f}, {c['baseline']} {theirs:.0f} samples per CPU s)"


def _rate(figs: dict[str, Any]) -> str:
    """Samples/s, with how many rounds its median is of."""
    return f"{figs['samples_per_s']:.1f}" + (f" (median of {figs['rounds']} rounds)" if figs["rounds"] > 1 else "")


def _compare_rows(c: dict[str, Any]) -> list[tuple[str, Any]]:
    name = c["baseline"]
    firsts = {n: [k + 1 for k, order in enumerate(c["order"]) if order[0] == n] for n in ("feedfast", name)}
    order = "; ".join(f"{n} first in round{'s' if len(ks) > 1 else ''} {', '.join(map(str, ks))}"
                      for n, ks in firsts.items() if ks)
    return [
        (f"{name} baseline", c["recipe"]),
        (f"{name} samples/s", _rate(c)),
        (f"{name} CPU / peak RSS", f"{c['cpu_util']:.0f} % / {c['peak_rss_mb']:.0f} MB (this process and its workers)"),
        (f"ratio feedfast/{name}", c["ratio_spread_text"]),
        ("ratio per CPU second", _per_cpu_text(c)),
        ("round order", order),
    ]
