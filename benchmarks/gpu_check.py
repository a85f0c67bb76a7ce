"""One check of feedfast on a machine with an NVIDIA GPU; ``--dry-run`` checks the plumbing on a CPU.

Usage::

    python benchmarks/gpu_check.py [--wheels DIR] [--dry-run] [--json out.json] [--budget 300]
                                   [--limit 360] [--samples N] [--only SECTION,...] [--target DIR]

Sections, in order (the most important first, so that a short budget cuts the least). Each is
independent: a failure is recorded as ``error: <one line>`` (with the traceback on stderr) and
the next section runs.

======================  ========================================================================
``setup``               DALI, webdataset, braceexpand, PyYAML, psutil, numpy and PIL import; when
                        one does not and a folder is given (``--wheels`` or ``$WHEELS``) holding the
                        pieces ``make gpu-wheels`` made (``site-py312.tar.xz.part-1-of-N`` ...), all N
                        must be there (a missing one is named); the site they hold is unpacked from
                        them into ``--target`` (default ``WHEELS/site-py312``), put on ``sys.path``,
                        and feedfast's C extensions with their libjpeg are copied from it into this
                        checkout's ``feedfast/`` (the GPU machine cannot build them; see
                        ``gpucheck_wheels.py``); each extension then imports or the section fails.
                        A folder of ``.whl`` files or ``wheels.tar.part-aa`` ... pieces (the older
                        form) is installed with ``pip install --no-index --no-deps --target``.
``dataset``             ``--samples N`` photo-like JPEGs (2,048 on a GPU: 32 batches an epoch, so a
                        training row crosses epoch boundaries as training does), generated once
                        into feedfast's cache.
``readme_default``      the README's call, ``feedfast.DataLoader("pipelines/imagenet-train.yaml",
                        shards=..., batch_size=64)`` with no device or placement: with CUDA it must
                        yield CUDA tensors on the current device from a GPU-placed plan.
``dali_anchor``         a hand-written DALI pipeline of the same graph on the same shards (batch 256,
                        ``mixed`` decode), epoch after epoch: the rate every GPU row is divided by, its
                        first batch and epoch boundaries (``gpucheck_anchor.py``).
``decode_gpu``          the default loader alone, ``feedfast.DataLoader("imagenet-train", shards=...,
                        batch_size=256, device="cuda")`` (it must run DALI GPU-placed), no model:
                        samples/s against one H200's feeding target, 7,950 images/s (MLPerf Training
                        v4.0, NVIDIA's single-node H200 ResNet-50, ~63,400 over 8 GPUs, reported), and
                        judged against ``dali_anchor`` (issue 36): rate at least 0.9 of its, first batch
                        at most 1 s after its, the longest epoch boundary (an epoch's last batch to the
                        next one's first, over the run's 8 epochs) at most 2 of its own batch periods.
``train_synthetic``     ResNet-50 (bf16 autocast, channels_last, SGD) at batch 256 on one synthetic batch
                        kept on the device: the compute ceiling (``gpucheck_default.py``).
``train_default``       the same fed by the default loader at batch 256: at least 0.95 of
                        ``train_synthetic``'s rate (issue 36).
``recipe_gpu``          ``imagenet-train-recipe`` (TrivialAugmentWide, RandomErasing, mixup/cutmix, crop
                        176) GPU-placed on DALI at batch 256, alone: images/s and its share of
                        ``dali_anchor``'s (reported; no target).
``pixels_hw``           every measured batch of hardware-decoded images (``hw_decoder_load=1.0``,
                        imagenet-val) against DALI's CPU decode of the same samples: one image off
                        by more than a few levels fails the check (a decoder race must not pass as
                        speed).
``folder_gpu``          an image folder read in place (issue 38): the dataset's photos written once as an
                        ``ImageFolder`` tree, then (a) a hand-written DALI pipeline of the same graph over it
                        (``fn.readers.file`` with ``shuffle_after_epoch``, ``mixed`` decode, batch 256) and (b)
                        ``feedfast.DataLoader("imagenet-train", shards=<folder>, batch_size=256, device="cuda")``
                        (DALI GPU-placed), in alternating rounds: each rate, each first batch, and the median
                        ratio (b)/(a), at least 0.9 (``gpucheck_folder.py``).
``train_feedfast_gpu``  (a) ResNet-50 (bf16 autocast, channels_last, SGD) fed by feedfast GPU-placed
                        (DALI, ``mixed`` nvJPEG decode) to ``cuda``.
``train_feedfast_cpu``  (b) the same fed by feedfast CPU-placed on DALI's CPU operators through the
                        pinned ring to ``cuda`` (to the CPU in a dry run).
``train_threads``       (b2) the same fed by feedfast's threaded CPU path (pillow-simd).
``train_torch``         (c) the same fed by the torchvision recipe (``make_torch_loader``, 16
                        workers where there are 16 cores), pinned and copied inside the measured wait.
``train_tuned``         (d) the same fed by the threaded path with ``tune=True``: the search's
                        decision, reasons and trials are recorded with the rate (issue 16).
``sync_debug``          one whole epoch of CPU-placed -> cuda and one of GPU-placed under
                        ``torch.cuda.set_sync_debug_mode("error")``: any host sync fails it.
``loader_gpu``          imagenet-train images/s alone, GPU-placed to ``cuda``.
``loader_cpu_cuda``     the same CPU-placed, delivered to ``cuda`` (pinned ring, uint8 transfer).
``placement``           ``loader_gpu`` against ``loader_cpu_cuda``: GPU placement (what ``auto`` picks on a
                        GPU machine) under 0.9 of CPU placement's rate fails.
``loader_cpu_cpu``      the same CPU-placed, delivered to the CPU.
``stall``               StallMeter's CUDA-event stall against an injected one: a loader sleeping S
                        ms per batch while each step enqueues T ms of calibrated GPU matmuls, so
                        the GPU idles max(0, S - T) of every S ms step (S=20, T=10: 0.5; S=5: 0).
``nvml``                the meter's NVML figures (gpu_util, gpu_mem_mb) under a GPU-bound loop.
======================  ========================================================================

A row judged against a target says ``pass`` or ``FAIL`` beside the target; on a GPU a missed target fails its
section (an error, exit status 1), in a dry run it is reported only (CPU figures are not the GPU's).

Each training feed gives one row: samples/s, the meter's GPU stall fraction from CUDA events
over 60 measured steps (after 10 warm-up steps), NVML utilization over those steps only, and
seconds from creating the loader to the first batch. A row runs the backend its label names
(asked for by name and checked).

Without CUDA (or with ``--dry-run``) everything that can runs on the CPU at tiny sizes: 64 px
crops, a few batches, a small dataset, a tiny model when torchvision is missing, the meter's
clock-backed GPU stand-in (``SimulatedGpu``) for the stall check; sections that need a GPU
say ``skipped: no CUDA (dry run)``.

One table is printed at the end; ``--json`` writes everything, and is rewritten after every
section (``"complete": false`` until the end), so a run cut short keeps what it measured.

Nothing can lose the 15-minute GPU lease: every loader has a timeout (60 s on a GPU), a
section past its own limit prints every thread's traceback (``faulthandler``), a time budget
(``--budget``, default 300 s) skips the sections left when it runs out, and an outer limit
(``--limit``, default 360 s) ends the run whatever it is stuck in, after writing the JSON
(see ``gpucheck_guard.py``): the lease then still holds the machine's start and a rerun. Exit
status: 0 when every section ran (a dry run's GPU-only skips included), 1 when any section
errored, hung past its limit or was cut by the budget, 2 for a bad command line, 3 when the
outer limit ended the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # this checkout's feedfast, pip-installed or not
    sys.path.insert(0, str(REPO))
if str(HERE) not in sys.path:  # the gpucheck_* modules beside this script, from any cwd
    sys.path.insert(0, str(HERE))

from gpucheck_anchor import dali_anchor_section, placement_section  # noqa: E402
from gpucheck_common import (  # noqa: E402
    DEFAULT_BUDGET,
    DEFAULT_LIMIT,
    DRY_SIZES,
    GPU_SIZES,
    Budget,
    Context,
    OverBudget,
    Section,
    Skip,
    one_line,
    say,
)
from gpucheck_decode import decode_gpu_section, pixels_hw_section  # noqa: E402
from gpucheck_default import recipe_gpu_section, train_default_section, train_synthetic_section  # noqa: E402
from gpucheck_folder import folder_gpu_section  # noqa: E402
from gpucheck_guard import Watchdog, enable_crash_tracebacks  # noqa: E402
from gpucheck_report import render, table_rows, write_json  # noqa: E402
from gpucheck_sections import (  # noqa: E402
    dataset_section,
    loader_cpu_cpu_section,
    loader_cpu_cuda_section,
    loader_gpu_section,
    nvml_section,
    stall_section,
)
from gpucheck_smoke import readme_default_section, sync_debug_section  # noqa: E402
from gpucheck_train import (  # noqa: E402
    train_feedfast_cpu_section,
    train_feedfast_gpu_section,
    train_threads_section,
    train_torch_section,
    train_tuned_section,
)
from gpucheck_wheels import setup_section  # noqa: E402


# ---------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Step:
    """A section to run: its key, table title, function and whether it needs CUDA."""

    name: str
    title: str
    run: Callable[[Context, Section], None]
    needs_cuda: bool = False


STEPS = (
    Step("setup", "setup", setup_section),
    Step("dataset", "dataset", dataset_section),
    Step("readme_default", "README call, no device/placement", readme_default_section),
    Step("dali_anchor", "hand-written DALI, the anchor", dali_anchor_section),
    Step("decode_gpu", "default loader alone, batch 256", decode_gpu_section),
    Step("train_synthetic", "ResNet-50 <- synthetic data, batch 256 (ceiling)", train_synthetic_section),
    Step("train_default", "ResNet-50 <- default loader, batch 256", train_default_section),
    Step("recipe_gpu", "imagenet-train-recipe GPU-placed alone, batch 256", recipe_gpu_section),
    Step("pixels_hw", "hardware-decoded pixels vs DALI CPU", pixels_hw_section),
    Step("folder_gpu", "image folder: feedfast vs hand-written readers.file", folder_gpu_section),
    Step("train_feedfast_gpu", "(a) ResNet-50 <- feedfast DALI GPU-placed", train_feedfast_gpu_section,
         needs_cuda=True),
    Step("train_feedfast_cpu", "(b) ResNet-50 <- feedfast DALI CPU-placed, pinned ring", train_feedfast_cpu_section),
    Step("train_threads", "(b2) ResNet-50 <- feedfast threads CPU-placed, pinned ring", train_threads_section),
    Step("train_torch", "(c) ResNet-50 <- torchvision recipe", train_torch_section),
    Step("train_tuned", "(d) ResNet-50 <- feedfast threads CPU-placed, tune=True", train_tuned_section),
    Step("sync_debug", "sync-debug epoch", sync_debug_section),
    Step("loader_gpu", "loader GPU-placed -> cuda", loader_gpu_section, needs_cuda=True),
    Step("loader_cpu_cuda", "loader CPU-placed -> cuda", loader_cpu_cuda_section, needs_cuda=True),
    Step("placement", "auto: GPU- against CPU-placed", placement_section, needs_cuda=True),
    Step("loader_cpu_cpu", "loader CPU-placed -> cpu", loader_cpu_cpu_section),
    Step("stall", "stall meter", stall_section),
    Step("nvml", "NVML sampler", nvml_section),
)


def run_step(step: Step, ctx: Context, watchdog: Watchdog | None = None) -> Section:
    """Run one section, recording a skip, an over-run or an error instead of raising.

    Under ``watchdog`` the section runs within ``Sizes.section_limit``: past it every thread's
    traceback is printed, and a section that then completes is still recorded as an error.
    """
    sec = Section(step.name, step.title)
    started = time.perf_counter()
    try:
        if step.needs_cuda and not ctx.cuda:
            raise Skip("dry run (--dry-run)" if ctx.cuda_present else "no CUDA (dry run)")
        ctx.budget.check()
        if watchdog is None:
            step.run(ctx, sec)
        else:
            with watchdog.section(step.name, ctx.sizes.section_limit):
                step.run(ctx, sec)
            if step.name in watchdog.hung:
                raise TimeoutError(f"ran {time.perf_counter() - started:.0f} s, past its limit of "
                                   f"{ctx.sizes.section_limit:g} s (tracebacks on stderr)")
    except Skip as exc:
        sec.status, sec.note = "skipped", f"skipped: {exc}"
    except OverBudget as exc:
        sec.status, sec.note = "over-budget", f"skipped: {exc}"
    except Exception as exc:  # noqa: BLE001 - every failure is recorded and the next section runs
        sec.status, sec.note = "error", f"error: {one_line(exc)}"
        sec.data["traceback"] = traceback.format_exc()
        print(sec.data["traceback"], file=sys.stderr, flush=True)
    sec.seconds = time.perf_counter() - started
    say(f"{step.name}: {sec.status} in {sec.seconds:.1f} s{' - ' + sec.note if sec.note else ''}")
    return sec


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="sections: " + ", ".join(s.name for s in STEPS))
    p.add_argument("--wheels", type=Path, default=None, help="folder of the pieces make gpu-wheels made, or of wheels (default: $WHEELS)")
    p.add_argument("--target", type=Path, default=None, help="where they are unpacked or installed (default: WHEELS/site-pyXY)")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (implied without CUDA)")
    p.add_argument("--json", dest="json_path", default=None, help="write the results here")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                   help=f"seconds in which sections may start (default {DEFAULT_BUDGET:g})")
    p.add_argument("--limit", type=float, default=DEFAULT_LIMIT,
                   help=f"seconds after which the run is ended, JSON written (default {DEFAULT_LIMIT:g})")
    p.add_argument("--samples", type=int, default=None, help="generate this many samples instead of the demo set")
    p.add_argument("--only", default=None, help="comma-separated sections to run (setup and dataset always run)")
    args = p.parse_args(argv)
    if args.budget <= 0 or args.limit <= 0 or (args.samples is not None and args.samples < 1):
        p.error("--budget and --limit must be > 0 and --samples >= 1")
    names = {s.name for s in STEPS}
    if args.only and not set(args.only.split(",")) <= names:
        p.error(f"--only {args.only!r}: sections are {', '.join(sorted(names))}")
    return args


def make_context(args: argparse.Namespace) -> Context:
    """Settings from the command line and the environment (``$WHEELS``)."""
    cuda = torch.cuda.is_available()
    dry = args.dry_run or not cuda
    sizes = DRY_SIZES if dry else GPU_SIZES
    if args.samples is not None:
        sizes = replace(sizes, samples=args.samples)
    wheels = args.wheels or (Path(os.environ["WHEELS"]) if os.environ.get("WHEELS") else None)
    if not cuda:
        say("torch sees no CUDA device: running as a dry run")
    return Context(sizes=sizes, dry=dry, cuda=cuda and not args.dry_run, cuda_present=cuda,
                   budget=Budget(args.budget), wheels=wheels, target=args.target)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every section, print the table, write the JSON (after every section too); the exit status."""
    args = parse_args(argv)
    enable_crash_tracebacks()
    ctx = make_context(args)
    chosen = set(args.only.split(",")) | {"setup", "dataset"} if args.only else {s.name for s in STEPS}
    sections: list[Section] = []

    def save(code: int | None, complete: bool) -> None:
        if args.json_path:
            write_json(args.json_path, code, ctx, sections, table_rows(sections), complete=complete,
                       limit_s=args.limit)

    watchdog = Watchdog(args.limit, lambda: save(3, False))
    try:
        for step in STEPS:
            if step.name in chosen:
                sections.append(run_step(step, ctx, watchdog))
                save(None, False)
    finally:
        watchdog.stop()
    bad = [s.name for s in sections if s.status in ("error", "over-budget")]
    rows = table_rows(sections)
    print(render(rows), flush=True)
    code = 1 if bad else 0
    print(f"\n{len(sections)} sections in {ctx.budget.elapsed():.0f} s; "
          f"{'problems in: ' + ', '.join(bad) if bad else 'all ran'}", flush=True)
    save(code, True)
    return code


if __name__ == "__main__":
    sys.exit(main())
