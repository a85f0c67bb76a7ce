"""What the threaded CPU path needs to know about an op, declared by the op itself.

The threaded path (:mod:`feedfast.loader.backends.cpu.thread_sample`, :mod:`feedfast.loader.backends.cpu.batchplan`)
never matches on op names: it reads an op's :class:`Threaded` declaration.

- ``decode``: the op that turns bytes into an image (the path decodes it itself, at reduced
  size and over the region the views read).
- ``geometry``: a crop of the current view and/or a resampling to a size, as a
  :class:`Geometry` computed from the view's size, the parameters and the sample's draws;
  composed into one ``resize(box=...)`` per output.
- ``flip``: which flips, from the parameters and the draws; applied when the pixels are written.
- ``kernel``: a CPU kernel over the finished uint8 HWC image of fixed size (after every
  geometry op of its chain), run in the worker thread.
- ``normalize``: done per batch as the pixels are written.
- ``tensor``: a kernel over one sample's normalized float slot of the batch, in place
  (after ``normalize``, as torchvision's ``RandomErasing``).

An op without a declaration sends the spec to the per-sample PIL program (and ``auto`` to it,
naming the op). ``plan_row`` is the op's row in ``feedfast/_plan.c``'s chain (codes below,
which mirror ``OP_`` there); an op without one is walked in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

from feedfast.ops.base import Rng

if TYPE_CHECKING:
    import numpy as np

Role = Literal["decode", "geometry", "flip", "kernel", "normalize", "tensor"]

PLAN_DECODE, PLAN_RRC, PLAN_RESIZE_SHORT, PLAN_RESIZE_HW, PLAN_CENTER_CROP, PLAN_FLIP = 1, 2, 3, 4, 5, 6
"""Op codes of a chain row in ``_plan.c``."""
PLAN_SLOTS, PLAN_COLS = 12, 24
"""Values per op of a chain row (``_plan.c``'s ``OP_SLOTS``), columns of a plan's row per sample (``PLAN_COLS``)."""
PLAN_OK, PLAN_NOT_REGION, PLAN_FALLBACK, PLAN_BOMB, PLAN_LARGE = range(5)
"""A sample's plan status (``_plan.c``'s ``ST_``): every status but ``PLAN_OK`` sends it the Python way."""
(COL_STATUS, COL_WIDTH, COL_HEIGHT, COL_FACTOR, COL_REGION, COL_BOX, COL_SIZE, COL_CLIP, COL_RESAMPLE, COL_HFLIP,
 COL_VFLIP) = 0, 1, 2, 3, 4, 8, 12, 14, 18, 19, 20
"""Columns of a plan's row (``_plan.c``'s ``COL_``)."""


def plan_program(rows: "list[list[float]]") -> "np.ndarray":
    """A chain's rows (decode first) as ``_plan.c`` reads them: float64 [ops, PLAN_SLOTS], zero-padded."""
    import numpy as np

    program = np.zeros((len(rows), PLAN_SLOTS), dtype=np.float64)
    for i, row in enumerate(rows):
        program[i, :len(row)] = row
    return program


@dataclass(frozen=True)
class Geometry:
    """A geometry op's effect on a view of ``width`` x ``height`` pixels.

    Attributes:
        crop: (left, top, width, height) of the view taken first, or None.
        size: the (width, height) the (cropped) view is resampled to, or None for no resampling.
        resample: the PIL filter of that resampling.
    """

    crop: tuple[int, int, int, int] | None = None
    size: tuple[int, int] | None = None
    resample: int | None = None


GeometryRule = Callable[[int, int, dict[str, Any], Rng], "Geometry | None"]
"""``(width, height, params, rng) -> Geometry``; None when this sample needs the PIL program (a crop that pads)."""


@dataclass(frozen=True)
class Threaded:
    """An op's form on the threaded path (see the module docstring for the roles).

    Attributes:
        role: what the op is to the threaded path.
        geometry: for ``geometry``: the rule above.
        resamples: for ``geometry``: whether it resamples (a chain resamples at most once).
        flips: for ``flip``: ``(params, rng) -> (horizontal, vertical)``.
        kernel: for ``kernel``: ``(uint8 HWC array, params, rng) -> uint8 HWC array`` of the same
            shape; for ``tensor``: ``(float array, params, rng) -> None``, in place, where the
            caller adds the input's layout (``CHW`` or ``HWC``) to the params as ``layout``.
        plan_row: ``params -> row`` of ``_plan.c``'s chain, None where the plan cannot take the
            parameters (the Python walk raises the error naming the op); ``[]`` for no row.
    """

    role: Role
    geometry: GeometryRule | None = None
    resamples: bool = False
    flips: Callable[[dict[str, Any], Rng], tuple[bool, bool]] | None = None
    kernel: Callable[..., Any] | None = None
    plan_row: Callable[[dict[str, Any]], "list[float] | None"] | None = None
