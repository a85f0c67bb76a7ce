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
  (:func:`~feedfast.loader.pil_fast.decode_region`: rows above it entropy-decoded only, columns
  beside it not transformed, rows below never read; the same pixels as Pillow's decode, and
  the resize's coordinates relative to the same corner as on a cropped image, so the same
  floats); else rows only down to the lowest one read (:func:`~feedfast.loader.pil_fast.load_rows`);
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

import io
import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from feedfast.compile.pil import PilProgram, PilStep
from feedfast.loader.pil_fast import REGION_FORMATS, JpegHeader, decode_region, exported_pixels, jpeg_header, load_rows
from feedfast.loader.pil_warnings import routed
from feedfast.ops.base import Rng, as_hw
from feedfast.ops.generic import DecodeFailure
from feedfast.ops.geometry import _pil_interp
from feedfast.ops.pil_ops import random_resized_crop_params
from feedfast.ops.registry import OPS

FAST_OPS = frozenset({"decode", "random_resized_crop", "resize", "center_crop", "flip", "normalize"})
"""Image ops the threaded path runs itself; any other image op sends the spec to the PIL program."""

RESAMPLING = frozenset({"random_resized_crop", "resize"})
GEOMETRY = RESAMPLING | {"center_crop"}
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


def fast_program_blocker(program: PilProgram) -> str | None:
    """Why the threaded path cannot run the program itself (naming the op and its key), None when it can."""
    resamples: dict[int, int] = {}
    flipped: dict[int, bool] = {}
    outputs = set(program.outputs.values())
    consumed = {i for s in program.steps for i in s.inputs}
    for step in program.steps:
        if step.op == "read" or OPS[step.op].host:
            continue
        if step.op not in FAST_OPS:
            return f"op `{step.op}` ({step.key}) is not one the threaded path runs ({', '.join(sorted(FAST_OPS))})"
        parent = step.inputs[0]
        resamples[step.id] = resamples.get(parent, 0) + (step.op in RESAMPLING)
        flipped[step.id] = flipped.get(parent, False) or step.op == "flip"
        if resamples[step.id] > 1:
            return f"op `{step.op}` ({step.key}) resamples an image a second time"
        if step.op in GEOMETRY and flipped.get(parent, False):
            return f"op `{step.op}` ({step.key}) comes after a flip"
        if step.op == "normalize" and (step.id not in outputs or step.id in consumed):
            return f"`normalize` ({step.key}) is not the last op of an output"
    return None


def _decode_failure(step: PilStep, exc: BaseException, raw: bytes) -> DecodeFailure:
    what = "the component is empty" if not raw else f"{type(exc).__name__}: {exc}"
    return DecodeFailure(f"`{step.op}` failed ({step.key}): cannot decode the image ({what})")


def _open(step: PilStep, raw: bytes) -> Any:
    from PIL import Image

    try:
        return Image.open(io.BytesIO(raw))
    except (*_PIL_ERRORS, Image.DecompressionBombError) as exc:
        raise _decode_failure(step, exc, raw) from None


def _header(step: PilStep, raw: bytes) -> Any:
    """A JPEG's :class:`~feedfast.loader.pil_fast.JpegHeader` where region decoding takes it, else Pillow's image."""
    from PIL import Image

    try:
        header = jpeg_header(raw)
    except Image.DecompressionBombError as exc:
        raise _decode_failure(step, exc, raw) from None
    return header if header is not None else _open(step, raw)


def _geometry(step: PilStep, view: View, rng: Rng) -> View:
    p = step.params
    width, height = view.size
    if step.op == "random_resized_crop":
        out_h, out_w = as_hw(p["size"])
        top, left, h, w = random_resized_crop_params(width, height, tuple(p["scale"]), tuple(p["ratio"]), rng)
        return replace(view.crop(left, top, w, h), size=(out_w, out_h), resample=_pil_interp(p["interpolation"]))
    if step.op == "resize":
        if isinstance(p["size"], int):  # torchvision's Resize(int): the longer side truncated
            short, long = sorted((width, height))
            new = (p["size"], int(p["size"] * long / short))
            size = new if width <= height else (new[1], new[0])
        else:
            h, w = as_hw(p["size"])
            size = (w, h)
        if size == view.size:
            return view
        return replace(view, size=size, resample=_pil_interp(p["interpolation"]))
    th, tw = as_hw(p["size"])  # center_crop
    if th > height or tw > width:
        raise NeedsFallback
    return view.crop(int(round((width - tw) / 2.0)), int(round((height - th) / 2.0)), tw, th)


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
        if step.op == "read":
            values[step.id] = raw[step.id]
        elif step.op == "decode":
            img = _header(step, value)
            opened[step.id] = (img, step, value)
            width, height = img.size
            values[step.id] = View(step.id, (0.0, 0.0, float(width), float(height)), img.size, (0, 0, width, height))
        elif step.op in GEOMETRY:
            values[step.id] = _geometry(step, value, rng)
        elif step.op == "flip":
            h = rng.random() < step.params["horizontal"]
            v = rng.random() < step.params["vertical"]
            values[step.id] = replace(value, hflip=value.hflip ^ h, vflip=value.vflip ^ v)
        elif step.op == "normalize":
            values[step.id] = value  # normalized per batch
        else:
            values[step.id] = _host(step, value, rng)
    views = {name: values[sid] for name, sid in program.outputs.items() if isinstance(values[sid], View)}
    pixels = _materialize(views, opened)
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

    from feedfast.sources.decoders import to_8bit

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

    A ``normalize`` output gives its input's pixels (the batch is normalized at once). PIL's
    warnings go to logging, as in :func:`fast_values`.
    """
    with routed(sample):
        values = program.trace(raw, rng)
    out: dict[str, Any] = {}
    for name, sid in program.outputs.items():
        step = program.steps[sid]
        value = values[step.inputs[0]] if step.op == "normalize" else values[sid]
        if step.sig.kind == "image" or step.op == "normalize":
            arr = np.asarray(value, dtype=np.uint8)
            value = arr[:, :, None] if arr.ndim == 2 else arr
        out[name] = value
    return out
