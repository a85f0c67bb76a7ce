"""A batch's image geometry planned at once, in C (``feedfast/_plan.c``), for the threaded path.

:func:`~feedfast.loader.backends.cpu.thread_sample.fast_values` walks one sample's image chain in Python:
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

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from feedfast.compile.pil import PilProgram, PilStep
from feedfast.ops import threaded as th
from feedfast.ops.registry import OPS

try:
    from feedfast import _plan as ext
except ImportError:  # not built at install: the Python walk does the work
    ext = None

COLS, SLOTS = th.PLAN_COLS, th.PLAN_SLOTS
OK, NOT_REGION, FALLBACK, BOMB, LARGE = th.PLAN_OK, th.PLAN_NOT_REGION, th.PLAN_FALLBACK, th.PLAN_BOMB, th.PLAN_LARGE
"""Plan statuses: every status but ``OK`` sends the sample the Python way (see ``_plan.c``)."""
STATUS, WIDTH, HEIGHT, FACTOR, REGION, BOX, SIZE, CLIP, RESAMPLE, HFLIP, VFLIP = (
    th.COL_STATUS, th.COL_WIDTH, th.COL_HEIGHT, th.COL_FACTOR, th.COL_REGION, th.COL_BOX, th.COL_SIZE, th.COL_CLIP,
    th.COL_RESAMPLE, th.COL_HFLIP, th.COL_VFLIP)
"""Columns of a plan row (``_plan.c``'s ``COL_``, named in :mod:`feedfast.ops.threaded`)."""

_DRAWLESS_HOST = frozenset(name for name, op in OPS.items() if op.host and not op.random)


@dataclass(frozen=True)
class Chain:
    """A program's image chain as ``_plan.c`` reads it.

    Attributes:
        ops: float64 [ops, SLOTS]: decode first, then each geometry or flip op.
        output: the image output's field name; ``decode``: the decode step's id; ``component``:
            the index of the component it reads.
        gray: whether the decode is to one channel.
        kernels: the chain's kernel ops (``OpDef.threaded`` role ``kernel``), run on the planned
            pixels before they are written.
    """

    ops: np.ndarray
    output: str
    decode: int
    component: int
    gray: bool
    kernels: tuple[PilStep, ...] = ()


def chain_of(program: PilProgram) -> Chain | None:
    """The program's image chain, or None when the plan does not apply (see the module's docstring)."""
    if ext is None:
        return None
    from feedfast.loader.backends.cpu import thread_sample
    image_outputs = [(name, sid) for name, sid in program.outputs.items()
                     if program.steps[sid].sig.kind == "image" or thread_sample.pixel_source(program, sid)[0]]
    if len(image_outputs) != 1:
        return None
    name, sid = image_outputs[0]
    sid = thread_sample.pixel_source(program, sid)[2]  # the tensor ops after normalize run per batch
    chain = []
    while True:
        step = program.steps[sid]
        chain.append(step)
        f = thread_sample.form(step)
        if f is None or f.role == "decode" or not step.inputs:
            break
        sid = step.inputs[0]
    chain.reverse()
    decode = chain[0]
    f = thread_sample.form(decode)
    if f is None or f.role != "decode" or program.steps[decode.inputs[0]].op != "read":
        return None
    image_steps = {s.id for s in chain}
    for step in program.steps:
        g = thread_sample.form(step)
        if step.op == "read" or step.id in image_steps or step.op in _DRAWLESS_HOST:
            continue
        if g is not None and g.role in ("normalize", "tensor"):
            continue  # on the output's one way (fast_program_blocker)
        return None  # another image chain, or a host op that may draw
    allowed = sum(f for f in thread_sample._DRAFT_FACTORS if f in (2, 4, 8))
    rows = [[th.PLAN_DECODE, float(decode.params["color"] == "gray"), allowed]]
    kernels = tuple(step for step in chain[1:] if thread_sample.form(step).role == "kernel")  # type: ignore[union-attr]
    for step in chain[1:]:
        row = _op_row(step)
        if row is None:
            return None
        if row:
            rows.append(row)
    return Chain(th.plan_program(rows), name, decode.id, decode.inputs[0], decode.params["color"] == "gray", kernels)


def _op_row(step: PilStep) -> list[float] | None:
    """One step's row of the chain (``[]``: none, as for a kernel or normalize, which run after the
    plan), or None when the plan cannot take it (its op declares no row: the Python walk runs it)."""
    f = OPS[step.op].threaded
    if f is None:
        return None
    if f.role == "kernel":
        return []
    return None if f.plan_row is None else f.plan_row(step.params)


ONE_CALL: bool | None = None
"""Whether planned samples are made in one call of the extension (:func:`one_call`); None: decided here."""


def one_call() -> bool:
    """Whether the threaded path makes a planned sample's pixels in one call of the extension
    (``sample_batch``: decode, resize, flips, normalize into the batch) rather than with Pillow from
    the planned region.

    Both give the same pixels (``tests/test_batchplan.py``); the extension's resize must be the
    installed Pillow's (:func:`feedfast.loader.backends.cpu.native.resample_flavour`) and as fast: against
    pillow-simd, its SIMD passes (SSE4.1 or AVX2, ``resample_isa``) are; against Pillow up to 12,
    both run plain C. Measured (a 300x400 JPEG to 224, flip, CHW float32): 936 us a sample in one
    call, 1,028 us through Pillow. ``ONE_CALL`` set here overrides it (tests, benchmarks).
    """
    if ONE_CALL is not None:
        return ONE_CALL
    from feedfast.loader.backends.cpu import native
    flavour = native.resample_flavour()
    if flavour is None or native.ext is None or not hasattr(native.ext, "sample_batch"):
        return False
    return flavour == native.FLAVOURS["pillow"] or int(native.ext.resample_isa()) >= 1


def plan(chain: Chain, raws: Sequence[bytes | memoryview | None], samples: np.ndarray, key: int,
         max_pixels: int | None) -> np.ndarray:
    """The plan rows of a batch: float64 [len(raws), COLS] (the columns above); ``raws``: each sample's JPEG as
    bytes or any contiguous buffer (a remote window's memoryview slice), None where it has none.

    Raises:
        TypeError: an item is not a buffer or not contiguous; names its place.
    """
    out = np.empty((len(raws), COLS), dtype=np.float64)
    assert ext is not None
    ext.plan_batch(list(raws), np.ascontiguousarray(samples, dtype=np.int64), key, chain.ops,
                   int(max_pixels or 0), out)
    return out
