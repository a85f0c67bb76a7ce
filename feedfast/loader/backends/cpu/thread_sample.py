"""One sample of the threaded CPU path: the PIL program's steps, with image geometry deferred.

:func:`fast_values` walks a :class:`~feedfast.compile.pil.PilProgram`'s steps in their order,
drawing from the sample's ``random.Random`` exactly where the PIL program draws (the same
crops and flips as the ``pil`` backend), but an image step only records what it would do:
a :class:`View` is a box in the source image's pixels, the size it maps to, the resampling
filter and the flips. Only when the outputs are known is each source decoded once, and each
view computed by one ``resize(size, box=...)`` (or one ``crop``), with:

- reduced-size JPEG decoding (DCT scaling, ``Image.draft``): the largest factor of 2, 4 or 8
  that keeps every box the source feeds at least its output size;
- only the region of a JPEG the views read (from their clips' corner to their boxes' and
  filters' reach), where feedfast's extension is built
  (:func:`~feedfast.loader.backends.cpu.pil_fast.decode_region`: rows above it entropy-decoded only, columns
  beside it not transformed, rows below never read; the same pixels as Pillow's decode, and
  the resize's coordinates relative to the same corner as on a cropped image, so the same
  floats); else rows only down to the lowest one read (:func:`~feedfast.loader.backends.cpu.pil_fast.load_rows`);
- flips left to the writer (a reversed NumPy view), and ``normalize`` to the batch.

What differs from the ``pil`` backend: nothing where no draft applies (the resize reads the
same pixels: a crop before it is taken first, and a resize before a crop is one ``box``
resize of the whole image, equal up to float rounding: one grey level at most); where a draft
applies, the image is the JPEG's DCT-scaled one, resized from there, and a remaining
reduction by more than :data:`REDUCING_GAP` first averages pixel blocks (Pillow's
``reducing_gap``). ``tests/test_thread_epoch.py`` checks both against tolerances.
:func:`fast_program` says whether a program can go this way; a sample it cannot take (a
``center_crop`` that would pad) raises :class:`NeedsFallback` and runs the PIL program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from feedfast.checks.decoders import open_image
from feedfast.compile.pil import PilProgram, PilStep, own_draws
from feedfast.loader.backends.cpu.pil_fast import (
    REGION_FORMATS,
    JpegHeader,
    decode_region,
    exported_pixels,
    jpeg_header,
    load_rows,
)
from feedfast.loader.backends.pil_warnings import routed
from feedfast.ops.base import Rng
from feedfast.ops.generic import DecodeFailure
from feedfast.ops.registry import OPS
from feedfast.ops.threaded import Threaded

FAST_OPS = frozenset(name for name, op in OPS.items() if op.threaded is not None)
"""Image ops the threaded path runs itself (those that declare ``OpDef.threaded``); any other
image op sends the spec to the PIL program."""

REDUCING_GAP = 3.0
"""Reductions larger than this first average blocks of pixels (Pillow's ``reducing_gap``)."""

_DRAFT_FACTORS = (8, 4, 2)
_PIL_ERRORS: tuple[type[BaseException], ...] = (OSError, SyntaxError, ValueError, EOFError)


class NeedsFallback(Exception):
    """This sample needs the PIL program (e.g. a ``center_crop`` larger than the image pads)."""


@dataclass(frozen=True)
class View:
    """An image step's result, not yet computed: ``box`` of the source resampled to ``size`` (w, h).

    ``clip`` is the source region the resampling filter may read: a crop taken before the
    resize (as ``random_resized_crop`` does) clips it, a crop after the resize does not.
    """

    source: int
    box: tuple[float, float, float, float]
    size: tuple[int, int]
    clip: tuple[int, int, int, int]
    resample: int | None = None
    hflip: bool = False
    vflip: bool = False
    kernels: tuple[PilStep, ...] = ()

    def crop(self, left: int, top: int, width: int, height: int) -> View:
        """The view of a ``width`` x ``height`` window at (``left``, ``top``) of this view."""
        x0, y0, x1, y1 = self.box
        sx, sy = (x1 - x0) / self.size[0], (y1 - y0) / self.size[1]
        box = (x0 + left * sx, y0 + top * sy, x0 + (left + width) * sx, y0 + (top + height) * sy)
        if self.resample is None:  # not resampled yet: view pixels are source pixels
            x0, y0, x1, y1 = (int(round(c)) for c in box)
            return replace(self, box=box, size=(width, height), clip=(x0, y0, x1, y1))
        return replace(self, box=box, size=(width, height))


def fast_program(program: PilProgram) -> bool:
    """Whether every step is a host op or a fast image op, each image chain resampling at most once,
    flipping only after its geometry, and normalizing only as an output."""
    return fast_program_blocker(program) is None


def form(step: PilStep) -> Threaded | None:
    """The step's op's form on the threaded path (None: a read, a host op, or an op without one)."""
    if step.op == "read":
        return None
    return OPS[step.op].threaded


def fast_program_blocker(program: PilProgram) -> str | None:
    """Why the threaded path cannot run the program itself (naming the op and its key), None when it can."""
    resamples: dict[int, int] = {}
    flipped: dict[int, bool] = {}
    kerneled: dict[int, bool] = {}
    normalized: dict[int, bool] = {}
    outputs = set(program.outputs.values())
    for step in program.steps:
        if step.op == "read" or OPS[step.op].host:
            continue
        f = form(step)
        if f is None:
            return f"op `{step.op}` ({step.key}) is not one the threaded path runs ({', '.join(sorted(FAST_OPS))})"
        parent = step.inputs[0]
        resamples[step.id] = resamples.get(parent, 0) + f.resamples
        flipped[step.id] = flipped.get(parent, False) or f.role == "flip"
        kerneled[step.id] = kerneled.get(parent, False) or f.role == "kernel"
        normalized[step.id] = normalized.get(parent, False) or f.role == "normalize"
        if resamples[step.id] > 1:
            return f"op `{step.op}` ({step.key}) resamples an image a second time"
        if f.role == "geometry" and flipped.get(parent, False):
            return f"op `{step.op}` ({step.key}) comes after a flip"
        if f.role in ("geometry", "flip") and kerneled.get(parent, False):
            return f"op `{step.op}` ({step.key}) comes after an op that runs on the finished image"
        if normalized.get(parent, False) and f.role != "tensor":
            return f"op `{step.op}` ({step.key}) comes after `normalize`"
        if f.role == "tensor" and not normalized.get(parent, False):
            return f"op `{step.op}` ({step.key}) needs `normalize` before it"
    for step in program.steps:
        f = form(step)
        if f is not None and f.role in ("normalize", "tensor"):
            readers = [s for s in program.steps if step.id in s.inputs]
            if step.id in outputs and readers or step.id not in outputs and len(readers) != 1:
                return f"`{step.op}` ({step.key}) is not on the one way to an output"
    return None


def pixel_source(program: PilProgram, sid: int) -> tuple[PilStep | None, tuple[PilStep, ...], int]:
    """An output's ``normalize`` step (or None), the tensor ops after it, and the step whose pixels it takes."""
    post: list[PilStep] = []
    step = program.steps[sid]
    while (f := form(step)) is not None and f.role == "tensor":
        post.append(step)
        step = program.steps[step.inputs[0]]
    f = form(step)
    if f is not None and f.role == "normalize":
        return step, tuple(reversed(post)), step.inputs[0]
    return None, (), sid


def _decode_failure(step: PilStep, exc: BaseException, raw: bytes) -> DecodeFailure:
    what = "the component is empty" if not raw else f"{type(exc).__name__}: {exc}"
    return DecodeFailure(f"`{step.op}` failed ({step.key}): cannot decode the image ({what})")


def _open(step: PilStep, raw: bytes) -> Any:
    from PIL import Image

    try:
        return open_image(raw)
    except (*_PIL_ERRORS, Image.DecompressionBombError) as exc:
        raise _decode_failure(step, exc, raw) from None


def _header(step: PilStep, raw: bytes) -> Any:
    """A JPEG's :class:`~feedfast.loader.backends.cpu.pil_fast.JpegHeader` where region decoding takes it, else Pillow's image."""
    from PIL import Image

    try:
        header = jpeg_header(raw)
    except Image.DecompressionBombError as exc:
        raise _decode_failure(step, exc, raw) from None
    return header if header is not None else _open(step, raw)


def _geometry(step: PilStep, view: View, rng: Rng) -> View:
    f = form(step)
    assert f is not None and f.geometry is not None
    g = f.geometry(view.size[0], view.size[1], step.params, rng)
    if g is None:
        raise NeedsFallback
    out = view.crop(*g.crop) if g.crop is not None else view
    if g.size is not None and (g.crop is not None or g.size != out.size):
        out = replace(out, size=g.size, resample=g.resample)
    return out


def run_kernels(pixels: np.ndarray, kernels: Sequence[PilStep], rng: Rng) -> np.ndarray:
    """The image's uint8 HWC pixels through its kernel ops, each drawing from its own stream."""
    for step in kernels:
        kernel = OPS[step.op].threaded.kernel  # type: ignore[union-attr]
        pixels = kernel(pixels, step.params, own_draws(step, rng))  # type: ignore[misc]
    return pixels


def fast_values(program: PilProgram, raw: Sequence[bytes], rng: Rng,
                sample: Sequence[str] | None = None) -> dict[str, Any]:
    """One sample's outputs: HWC uint8 arrays (flips as views) for image and normalize fields, host values.

    PIL's warnings go to logging, naming ``sample`` (shard, key) when given (:mod:`.pil_warnings`).

    Raises:
        DecodeFailure: a step could not read the sample (names the op and key).
        NeedsFallback: the sample needs the PIL program.
    """
    with routed(sample):
        return _fast_values(program, raw, rng)


def _fast_values(program: PilProgram, raw: Sequence[bytes], rng: Rng) -> dict[str, Any]:
    values: list[Any] = [None] * len(program.steps)
    opened: dict[int, tuple[Any, PilStep, bytes]] = {}
    for step in program.steps:
        value: Any = values[step.inputs[0]] if step.inputs else None
        f = form(step)
        if step.op == "read":
            values[step.id] = raw[step.id]
        elif f is None:
            values[step.id] = _host(step, value, rng)
        elif f.role == "decode":
            img = _header(step, value)
            opened[step.id] = (img, step, value)
            width, height = img.size
            values[step.id] = View(step.id, (0.0, 0.0, float(width), float(height)), img.size, (0, 0, width, height))
        elif f.role == "geometry":
            values[step.id] = _geometry(step, value, rng)
        elif f.role == "flip":
            assert f.flips is not None
            h, v = f.flips(step.params, rng)
            values[step.id] = replace(value, hflip=value.hflip ^ h, vflip=value.vflip ^ v)
        elif f.role == "kernel":
            values[step.id] = replace(value, kernels=value.kernels + (step,))  # run on the finished pixels
        else:  # normalize and the tensor ops after it: per batch, as the pixels are written
            values[step.id] = value
    views = {name: values[sid] for name, sid in program.outputs.items() if isinstance(values[sid], View)}
    pixels = _materialize(views, opened)
    pixels = {name: run_kernels(arr, views[name].kernels, rng) if views[name].kernels else arr
              for name, arr in pixels.items()}
    return {name: pixels.get(name, values[sid]) for name, sid in program.outputs.items()}


def _host(step: PilStep, value: Any, rng: Rng) -> Any:
    try:
        return OPS[step.op].pil(value, step.params, rng)  # type: ignore[misc]
    except DecodeFailure as exc:
        raise DecodeFailure(f"`{step.op}` failed ({step.key}): {exc}") from None


def draft_factor(view: View) -> int:
    """The largest DCT scaling (8, 4, 2) that keeps the view's box at least its output size, else 1."""
    if view.resample is None:
        return 1
    x0, y0, x1, y1 = view.box
    return next((s for s in _DRAFT_FACTORS if (x1 - x0) / s >= view.size[0] and (y1 - y0) / s >= view.size[1]), 1)


def _materialize(views: dict[str, View], opened: dict[int, tuple[Any, PilStep, bytes]]) -> dict[str, np.ndarray]:
    from PIL import Image

    from feedfast.checks.decoders import to_8bit

    out: dict[str, np.ndarray] = {}
    for source, (img, step, raw) in opened.items():
        mine = {name: v for name, v in views.items() if v.source == source}
        if not mine:
            continue
        width, height = img.size
        factor = min(draft_factor(v) for v in mine.values())
        target = "L" if step.params["color"] == "gray" else "RGB"
        origin = (0, 0)
        region = None
        if img.mode == target:  # a JPEG where the extension is built: only the region the views read
            scaled = (-(-width // factor), -(-height // factor))
            region = decode_region(img, raw, factor, region_needed(mine.values(), float(factor), scaled))
        try:
            if region is not None:
                decoded, origin = region[0], (region[1], region[2])
                scale = float(factor)
            else:
                if isinstance(img, JpegHeader):  # the region decoder refused it: Pillow decodes, or says why
                    img = _open(step, raw)
                scale = 1.0
                if factor > 1 and img.format in REGION_FORMATS:
                    drafted = img.draft(img.mode, (width // factor, height // factor))
                    scale = width / drafted[1][2] if drafted else 1.0
                if not load_rows(img, region_needed(mine.values(), scale, img.size)[3]):
                    raise NeedsFallback  # the rows did not decode: the full decode says why
                decoded = img if img.mode == target else to_8bit(img).convert(target)  # 16-bit scaled, not clipped
        except (*_PIL_ERRORS, Image.DecompressionBombError) as exc:
            raise _decode_failure(step, exc, raw) from None
        for name, view in mine.items():
            out[name] = view_pixels(decoded, view, scale, origin)
    return out


_FILTER_REACH = 3.0
"""Pixels a resampling filter reads beyond its box, per unit of scale (Lanczos: 3)."""


def region_needed(views: Any, scale: float, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The region (left, top, right, bottom) of the image, scaled by ``1 / scale``, that the views read.

    A view reads its clip from its top left corner (where the resize's coordinates start, so
    its floats round as they do on the clipped image), and where it resamples, no further right
    or down than its box and the filter's reach beyond it; ``size`` is the scaled image's.
    """
    left, top, right, bottom = float(size[0]), float(size[1]), 0.0, 0.0
    for v in views:
        c0, c1 = math.floor(v.clip[0] / scale), math.floor(v.clip[1] / scale)
        c2, c3 = math.ceil(v.clip[2] / scale), math.ceil(v.clip[3] / scale)
        if v.resample is not None:
            x0, y0, x1, y1 = (c / scale for c in v.box)
            c2 = min(c2, math.ceil(x1 + _FILTER_REACH * max((x1 - x0) / v.size[0], 1.0) + 1.0))
            c3 = min(c3, math.ceil(y1 + _FILTER_REACH * max((y1 - y0) / v.size[1], 1.0) + 1.0))
        left, top, right, bottom = min(left, c0), min(top, c1), max(right, c2), max(bottom, c3)
    width, height = size
    return (max(0, int(left)), max(0, int(top)), min(width, int(right) + 1), min(height, int(bottom) + 1))


def view_pixels(img: Any, view: View, scale: float, origin: tuple[int, int] = (0, 0)) -> np.ndarray:
    """The view's pixels from ``img``: the image scaled by ``1 / scale``, or its region at ``origin``."""
    ox, oy = origin
    if view.resample is None:
        clip = (view.clip[0] - ox, view.clip[1] - oy, view.clip[2] - ox, view.clip[3] - oy)
        result = img if clip == (0, 0, *img.size) and not img.readonly else img.crop(clip)
    else:
        x0, y0, x1, y1 = (c / scale for c in view.box)
        x0, y0, x1, y1 = x0 - ox, y0 - oy, x1 - ox, y1 - oy
        clip = (max(0, math.floor(view.clip[0] / scale) - ox), max(0, math.floor(view.clip[1] / scale) - oy),
                min(img.width, math.ceil(view.clip[2] / scale) - ox), min(img.height, math.ceil(view.clip[3] / scale) - oy))
        if clip != (0, 0, *img.size):
            img = img.crop(clip)
            x0, y0, x1, y1 = x0 - clip[0], y0 - clip[1], x1 - clip[0], y1 - clip[1]
        box = (max(0.0, x0), max(0.0, y0), min(float(img.width), x1), min(float(img.height), y1))
        result = img.resize(view.size, view.resample, box=box, reducing_gap=REDUCING_GAP if scale > 1 else None)
    arr = exported_pixels(result)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if view.hflip:
        arr = arr[:, ::-1]
    if view.vflip:
        arr = arr[::-1]
    return arr


def program_values(program: PilProgram, raw: Sequence[bytes], rng: Rng,
                   sample: Sequence[str] | None = None) -> dict[str, Any]:
    """One sample's outputs through the PIL program, shaped as :func:`fast_values` gives them.

    A ``normalize`` output (and a tensor op's after it) gives the pixels before ``normalize`` (the
    batch is normalized at once, then its tensor ops run). PIL's
    warnings go to logging, as in :func:`fast_values`.
    """
    with routed(sample):
        values = program.trace(raw, rng)
    out: dict[str, Any] = {}
    for name, sid in program.outputs.items():
        step = program.steps[sid]
        norm, _, source = pixel_source(program, sid)
        value = values[source]
        if step.sig.kind == "image" or norm is not None:
            arr = np.asarray(value, dtype=np.uint8)
            value = arr[:, :, None] if arr.ndim == 2 else arr
        out[name] = value
    return out
