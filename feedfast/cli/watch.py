"""``feedfast watch -- CMD``: how long an unchanged job's GPUs wait on its data loaders.

The job runs as given (``python train.py ARGS``, ``torchrun ...``, ``accelerate launch ...``)
with two changes to its environment: :mod:`feedfast.meter.startup` first on ``PYTHONPATH``
(Python's start-up hook; see :mod:`feedfast.meter.startup.sitecustomize`) and the
``FEEDFAST_WATCH_*`` settings (:class:`feedfast.meter.attach.WatchSettings`). Every Python
process of the job then meters each DataLoader it iterates (torch's, feedfast's) and writes
its figures to the run folder when it exits; ``watch`` reads them when the job is over and
prints one table (:mod:`feedfast.cli.watch_report`) with advice
(:mod:`feedfast.cli.watch_advice`) on stderr, so the job's stdout stays the job's.

The job's stdin, stdout and stderr are its own, and its exit status is ``watch``'s (128 + N
when a signal N ended it; 127 when the command is not found, 126 when it cannot run).
Ctrl-C reaches the job from the terminal as it would without ``watch``, which then prints the
figures so far; a SIGTERM sent to ``watch`` is passed on to the job. Nothing is installed or
left behind: the run folder is a temporary one, removed at the end, unless ``--run-dir``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import feedfast.meter.startup as startup
from feedfast.cli import watch_report
from feedfast.cli.common import write_json
from feedfast.errors import UserError
from feedfast.meter.watchenv import WatchSettings

EXAMPLES = """examples:
  feedfast watch -- python train.py --epochs 1                  # the table at the end, on stderr
  feedfast watch --every 100 --steps 500 -- python train.py     # a line every 100 steps; measure 500
  feedfast watch --json watch.json --plot watch.png -- torchrun --nproc_per_node 8 train.py
  feedfast watch -- accelerate launch train.py
"""

DESCRIPTION = """Run a training job unchanged and measure, on every rank, how long its training loop waits
for each DataLoader (torch's or feedfast's): the share of the step the GPU waited on data
(CUDA events on the loop's stream; host wait, labelled so, without CUDA), wait p50/p95,
samples/s, GPU utilization, the straggler rank, the verdict, and what to do next.
The job's output and exit status pass through; the table goes to stderr. The meter costs
the loop a few microseconds a step."""


def add_parser(sub: Any) -> None:
    """Register ``feedfast watch``."""
    p = sub.add_parser("watch", help="how long an unchanged job waits on its DataLoaders (every rank)",
                       epilog=EXAMPLES, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="also write the report as JSON (- for stdout)")
    p.add_argument("--plot", default=None, metavar="PATH", help="write a PNG of step time and data wait per step, a panel per rank")
    p.add_argument("--every", type=int, default=0, metavar="N", help="print a line on stderr every N steps of each loader")
    p.add_argument("--steps", type=int, default=0, metavar="N",
                   help="stop measuring a loader after N batches (the job runs on; default: the whole run)")
    p.add_argument("--run-dir", default=None, metavar="DIR",
                   help="keep each process's figures in this folder (default: a temporary one, removed)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the job, after --: python train.py ARGS, torchrun ...")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the job under the meter; print the table; return the job's exit status."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UserError("feedfast watch needs the job to run; fix: feedfast watch -- python train.py ARGS")
    for name in ("every", "steps"):
        if getattr(args, name) < 0:
            raise UserError(f"--{name} must be >= 0, got {getattr(args, name)}")
    run_dir = _run_dir(args.run_dir)
    settings = WatchSettings(run_dir, every=args.every, steps=args.steps, series=args.plot is not None)
    try:
        started = time.perf_counter()
        status = run_job(command, job_env(settings))
        report = watch_report.build(watch_report.load(run_dir), command=command, exit_status=status,
                                    wall_s=time.perf_counter() - started)
        print(watch_report.text(report), file=sys.stderr)
        _outputs(report, args)
    finally:
        if args.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)
    return status


def _run_dir(given: str | None) -> Path:
    if given is None:
        return Path(tempfile.mkdtemp(prefix="feedfast-watch-"))
    path = Path(given)
    path.mkdir(parents=True, exist_ok=True)
    if any(path.glob("proc-*.json")):
        raise UserError(f"--run-dir {given} holds figures of an earlier run (proc-*.json); "
                        "fix: give an empty folder or remove them")
    return path


def job_env(settings: WatchSettings, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The job's environment: ``environ`` (default: this one) with the start-up hook and the settings."""
    base = dict(os.environ if environ is None else environ)
    hook = str(Path(startup.__file__).resolve().parent)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (hook, base.get("PYTHONPATH", "")) if p)
    base.update(settings.to_env())
    return base


def run_job(command: list[str], env: dict[str, str]) -> int:
    """Run ``command``; its exit status (128 + N for signal N; 127 not found, 126 not runnable)."""
    try:
        job = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        print(f"feedfast watch: command not found: {command[0]}", file=sys.stderr)
        return 127
    except PermissionError as exc:
        print(f"feedfast watch: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 126

    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM and job.poll() is None:
            job.send_signal(signum)  # Ctrl-C reaches the job through the terminal's process group

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = job.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code if code >= 0 else 128 - code


def _outputs(report: dict[str, Any], args: argparse.Namespace) -> None:
    """``--json`` and ``--plot``; a failed plot is said, and the job's status still returned."""
    write_json(args.json_path, report)
    if args.plot is None:
        return
    try:
        print(f"feedfast watch: plot {watch_report.plot(report, args.plot)}", file=sys.stderr)
    except UserError as exc:
        print(f"feedfast watch: no plot: {exc}", file=sys.stderr)
