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
from typing import Any, Callable, Literal

from feedfast.ops.base import Rng

Role = Literal["decode", "geometry", "flip", "kernel", "normalize", "tensor"]

PLAN_DECODE, PLAN_RRC, PLAN_RESIZE_SHORT, PLAN_RESIZE_HW, PLAN_CENTER_CROP, PLAN_FLIP = 1, 2, 3, 4, 5, 6
"""Op codes of a chain row in ``_plan.c``."""


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
