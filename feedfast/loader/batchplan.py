"""A batch's image geometry planned at once, in C (``feedfast/_plan.c``), for the threaded path.

:func:`~feedfast.loader.thread_sample.fast_values` walks one sample's image chain in Python:
the JPEG's frame header, the random crop's draws, the flips, the view they compose to, the DCT
scaling and the region to decode; tens of microseconds a sample. :class:`Chain` is the same
chain as numbers, and :func:`plan` walks it for a whole batch in one call without the GIL,
with the same arithmetic (``tests/test_batchplan.py`` checks it against the Python walk, sample
for sample). :func:`read` reads the batch's image bytes the same way (``pread`` per sample,
the GIL released).

A chain applies to a program with one image output, made from one ``decode`` by
``random_resized_crop``, ``resize``, ``center_crop`` and ``flip`` (then maybe ``normalize``),
and host ops that draw nothing (labels, json, npy, bytes). Any other program, and any sample
the plan cannot take (not a JPEG the region decoder reads, a crop that pads, a huge image),
goes the Python way, whose rules are the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from feedfast.compile.pil import PilProgram
from feedfast.ops.base import as_hw
from feedfast.ops.geometry import _pil_interp

try:
    from feedfast import _plan as ext
except ImportError:  # not built at install: the Python walk does the work
    ext = None

COLS = 24
SLOTS = 12
OK, NOT_REGION, FALLBACK, BOMB, LARGE = range(5)
"""Plan statuses: every status but ``OK`` sends the sample the Python way (see ``_plan.c``)."""
STATUS, WIDTH, HEIGHT, FACTOR, REGION, BOX, SIZE, CLIP, RESAMPLE, HFLIP, VFLIP = 0, 1, 2, 3, 4, 8, 12, 14, 18, 19, 20
"""Columns of a plan row (``_plan.c``'s ``COL_``)."""

_DECODE, _RRC, _RESIZE_SHORT, _RESIZE_HW, _CENTER_CROP, _FLIP = 1, 2, 3, 4, 5, 6
_DRAWLESS_HOST = frozenset({"label", "json", "npy", "bytes"})


@dataclass(frozen=True)
class Chain:
    """A program's image chain as ``_plan.c`` reads it.

    Attributes:
        ops: float64 [ops, SLOTS]: decode first, then each geometry or flip op.
        output: the image output's field name; ``decode``: the decode step's id; ``component``:
            the index of the component it reads.
        gray: whether the decode is to one channel.
    """

    ops: np.ndarray
    output: str
    decode: int
    component: int
    gray: bool


def chain_of(program: PilProgram) -> Chain | None:
    """The program's image chain, or None when the plan does not apply (see the module's docstring)."""
    if ext is None:
        return None
    image_outputs = [(name, sid) for name, sid in program.outputs.items()
                     if program.steps[sid].sig.kind == "image" or program.steps[sid].op == "normalize"]
    if len(image_outputs) != 1:
        return None
    name, sid = image_outputs[0]
    chain = []
    while True:
        step = program.steps[sid]
        chain.append(step)
        if step.op == "decode" or not step.inputs:
            break
        sid = step.inputs[0]
    chain.reverse()
    decode = chain[0]
    if decode.op != "decode" or program.steps[decode.inputs[0]].op != "read":
        return None
    image_steps = {s.id for s in chain}
    for step in program.steps:
        if step.op != "read" and step.id not in image_steps and step.op not in _DRAWLESS_HOST:
            return None  # another image chain, or a host op that may draw
    if any(step.op == "normalize" for step in chain[:-1]):
        return None
    from feedfast.loader import thread_sample

    allowed = sum(f for f in thread_sample._DRAFT_FACTORS if f in (2, 4, 8))
    rows = [[_DECODE, float(decode.params["color"] == "gray"), allowed]]
    for step in chain[1:]:
        row = _op_row(step.op, step.params)
        if row is None:
            return None
        if row:
            rows.append(row)
    ops = np.zeros((len(rows), SLOTS), dtype=np.float64)
    for i, row in enumerate(rows):
        ops[i, :len(row)] = row
    return Chain(ops, name, decode.id, decode.inputs[0], decode.params["color"] == "gray")


def _op_row(op: str, p: dict[str, Any]) -> list[float] | None:
    """One op's row ([] for normalize, which the batch does), or None when the plan cannot take it."""
    if op == "normalize":
        return []
    if op == "random_resized_crop":
        (s0, s1), (r0, r1) = p["scale"], p["ratio"]
        if not (0 < s0 <= s1 and 0 < r0 <= r1):
            return None  # the Python walk raises the error that names the op
        h, w = as_hw(p["size"])
        return [_RRC, h, w, s0, s1, math.log(r0), math.log(r1), r0, r1, int(_pil_interp(p["interpolation"]))]
    if op == "resize":
        if isinstance(p["size"], int):
            return [_RESIZE_SHORT, p["size"], int(_pil_interp(p["interpolation"]))]
        h, w = as_hw(p["size"])
        return [_RESIZE_HW, h, w, int(_pil_interp(p["interpolation"]))]
    if op == "center_crop":
        h, w = as_hw(p["size"])
        return [_CENTER_CROP, h, w]
    if op == "flip":
        return [_FLIP, float(p["horizontal"]), float(p["vertical"])]
    return None  # any other image op (color_jitter, rotate, ...): the Python walk runs it


ONE_CALL: bool | None = None
"""Whether planned samples are made in one call of the extension (:func:`one_call`); None: decided here."""


def one_call() -> bool:
    """Whether the threaded path makes a planned sample's pixels in one call of the extension
    (``sample_batch``: decode, resize, flips, normalize into the batch) rather than with Pillow from
    the planned region.

    Both give the same pixels (``tests/test_batchplan.py``); the extension's resize must be the
    installed Pillow's (:func:`feedfast.loader.native.resample_flavour`) and as fast: against
    pillow-simd, its SIMD passes (SSE4.1 or AVX2, ``resample_isa``) are; against Pillow up to 12,
    both run plain C. Measured (a 300x400 JPEG to 224, flip, CHW float32): 936 us a sample in one
    call, 1,028 us through Pillow. ``ONE_CALL`` set here overrides it (tests, benchmarks).
    """
    if ONE_CALL is not None:
        return ONE_CALL
    from feedfast.loader import native

    flavour = native.resample_flavour()
    if flavour is None or native.ext is None or not hasattr(native.ext, "sample_batch"):
        return False
    return flavour == native.FLAVOURS["pillow"] or int(native.ext.resample_isa()) >= 1


def plan(chain: Chain, raws: Sequence[bytes | None], samples: np.ndarray, key: int, max_pixels: int | None) -> np.ndarray:
    """The plan rows of a batch: float64 [len(raws), COLS] (the columns above)."""
    out = np.empty((len(raws), COLS), dtype=np.float64)
    assert ext is not None
    ext.plan_batch(list(raws), np.ascontiguousarray(samples, dtype=np.int64), key, chain.ops,
                   int(max_pixels or 0), out)
    return out


def read(fds: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> list[bytes | None]:
    """Each sample's bytes (``pread`` of ``sizes`` at ``offsets`` of ``fds``), None where the read fails or is short."""
    assert ext is not None
    got: list[bytes | None] = ext.read_batch(np.ascontiguousarray(fds, dtype=np.int32),
                                             np.ascontiguousarray(offsets, dtype=np.int64),
                                             np.ascontiguousarray(sizes, dtype=np.int64))
    return got

