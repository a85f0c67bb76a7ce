"""Shared pieces of ``gpu_check.py``: sizes, the run context and budget, results, exceptions."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used, so the wheel packer runs without it
    import torch

REPO = Path(__file__).resolve().parents[1]
REQUIRED = ("nvidia.dali", "webdataset", "braceexpand", "yaml", "psutil", "numpy", "PIL")
"""Modules feedfast needs here; a missing one triggers the wheel install."""
SPEC = REPO / "pipelines" / "imagenet-train.yaml"
TOLERANCE = 0.05
"""Largest accepted gap between the measured and the expected stall fraction."""


# ---------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Sizes:
    """How much each section measures, and how long anything may wait."""

    batch: int
    image: int | None  # crop size override; None keeps the spec's 224
    warmup: int
    batches: int
    stall_steps: int
    nvml_seconds: float
    train_warmup: int
    train_steps: int  # measured steps per training row: at least the meter's 30 for a verdict (60 on a GPU)
    samples: int | None  # None: the demo dataset (1,024 samples)
    small_images: bool
    loader_timeout: float  # seconds any loader's next() may wait (feedfast's and torch's timeout)
    section_limit: float  # seconds a section may run before the watchdog prints every thread's traceback
    decode_batch: int  # batch of the decode + augment section
    decode_batches: int  # its measured batches
    pixel_batches: int  # batches of hardware-decoded images compared pixel by pixel


GPU_SIZES = Sizes(batch=64, image=None, warmup=5, batches=60, stall_steps=30, nvml_seconds=3.0,
                  train_warmup=10, train_steps=60, samples=2048, small_images=False, loader_timeout=60.0,
                  section_limit=120.0, decode_batch=256, decode_batches=60, pixel_batches=16)
"""2,048 samples (32 batches of 64 an epoch: a training row's 70 steps cross two epoch boundaries, as
training does); 60 measured steps per row, twice the meter's minimum for a verdict."""
DRY_SIZES = Sizes(batch=16, image=64, warmup=1, batches=4, stall_steps=10, nvml_seconds=0.5,
                  train_warmup=1, train_steps=3, samples=128, small_images=True, loader_timeout=120.0,
                  section_limit=240.0, decode_batch=16, decode_batches=4, pixel_batches=2)
FEED_TARGET = 7_950
"""Images/s one H200 must be fed: NVIDIA's MLPerf Training v4.0 single-node H200 ResNet-50 result, about
63,400 images/s over 8 GPUs."""
DEFAULT_BUDGET = 300.0
"""Seconds of the run's sections (each starts only inside it)."""
DEFAULT_LIMIT = 360.0
"""Seconds after which the watchdog ends the run, whatever runs: the 15-minute lease then still holds the
machine's start, the wheels and a rerun."""


@dataclass
class Context:
    """What sections share: settings, the clock budget, and what earlier sections made."""

    sizes: Sizes
    dry: bool
    cuda: bool  # CUDA is used (present and not a --dry-run)
    cuda_present: bool
    budget: Budget
    wheels: Path | None
    target: Path | None
    shards: str | None = None
    shard_paths: list[str] = field(default_factory=list)
    samples: int = 0
    results: dict[str, float] = field(default_factory=dict)  # figures a later section compares with

    @property
    def threads(self) -> int:
        """The CPU threads a pipeline gets here (the usable cores)."""
        from feedfast._env import usable_cores

        return usable_cores()

    @property
    def overrides(self) -> list[str]:
        """Spec overrides for the crop size (none at full size)."""
        return [f"pipeline.image[1].size={self.sizes.image}"] if self.sizes.image else []

    @property
    def device(self) -> torch.device:
        """Where models and measured work run."""
        import torch

        return torch.device("cuda" if self.cuda else "cpu")


class Skip(Exception):
    """A section cannot run here (no CUDA in a dry run, NVML absent); not an error."""


class OverBudget(Exception):
    """The time budget ran out before or during a section."""


class CheckFailed(Exception):
    """A figure was measured but is not what the check expects."""


class Budget:
    """A wall-clock allowance for the whole run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start

    def check(self) -> None:
        """Raise :class:`OverBudget` once the allowance is spent."""
        if self.elapsed() > self.seconds:
            raise OverBudget(f"time budget of {self.seconds:g} s spent after {self.elapsed():.0f} s")


# ---------------------------------------------------------------------------- results
@dataclass
class Row:
    """One line of the final table: a figure with its unit, or a feed's four columns, and a note."""

    what: str
    figure: float | str | None = None
    unit: str = ""
    note: str = ""
    samples_per_s: float | None = None
    stall: float | None = None
    gpu_util: float | None = None
    first_batch_s: float | None = None


@dataclass
class Section:
    """A section's outcome: ``ok``, ``skipped``, ``error`` or ``over-budget``, its rows and data."""

    name: str
    title: str
    status: str = "ok"
    note: str = ""
    seconds: float = 0.0
    rows: list[Row] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def add(self, what: str, figure: float | str | None, unit: str = "", note: str = "") -> None:
        """Append a table row."""
        self.rows.append(Row(what, figure, unit, note))

    def add_feed(self, what: str, *, samples_per_s: float | None, stall: float | None, gpu_util: float | None,
                 first_batch_s: float | None, note: str = "") -> None:
        """Append a row in the table's feed columns (samples/s, stall, GPU util, first batch)."""
        self.rows.append(Row(what, note=note, samples_per_s=samples_per_s, stall=stall, gpu_util=gpu_util,
                             first_batch_s=first_batch_s))


@dataclass(frozen=True)
class Target:
    """A figure's target, e.g. ``Target(">=", 0.9, "issue 36")``: the figure passes when ``figure op bound``."""

    op: str  # ">=" or "<="
    bound: float
    source: str = ""

    def met(self, figure: float) -> bool:
        """Whether ``figure`` meets the target."""
        return figure >= self.bound if self.op == ">=" else figure <= self.bound

    def text(self, unit: str = "") -> str:
        """``target >= 0.9 x (issue 36)``."""
        return f"target {self.op} {self.bound:g}{' ' + unit if unit else ''}{f' ({self.source})' if self.source else ''}"


def judge(sec: Section, what: str, figure: float | None, unit: str, target: Target, note: str = "") -> bool | None:
    """A row with the figure, its target and ``pass`` or ``FAIL`` (``n/a`` without a figure); kept in the section's
    ``data["targets"]`` for :func:`enforce`. Returns whether it passed (None: not measured)."""
    met = None if figure is None else target.met(figure)
    verdict = {None: "n/a", True: "pass", False: "FAIL"}[met]
    sec.add(what, figure, unit, f"{verdict}: {target.text(unit)}" + (f"; {note}" if note else ""))
    sec.data.setdefault("targets", {})[what] = {"figure": figure, "unit": unit, "op": target.op,
                                                "bound": target.bound, "verdict": verdict}
    return met


def enforce(ctx: Context, sec: Section) -> None:
    """Fail the section (:class:`CheckFailed`) when a target it judged was missed, on a GPU; a dry run's CPU figures
    are reported against the targets but never fail them (they are not the GPU's)."""
    missed = [f"{what}: {t['figure']:.3g} {t['unit']} (target {t['op']} {t['bound']:g})".replace("  ", " ")
              for what, t in sec.data.get("targets", {}).items() if t["verdict"] == "FAIL"]
    if missed and ctx.cuda:
        raise CheckFailed("missed: " + "; ".join(missed))
    if missed:
        sec.add("targets missed", len(missed), "", "not enforced: a dry run's CPU figures are not the GPU's")
        sec.data["targets_enforced"] = False


def say(message: str) -> None:
    """Progress on stderr (the table goes to stdout at the end)."""
    print(f"[gpu-check] {message}", file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    """An exception as ``Type: first line``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
