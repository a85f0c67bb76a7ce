"""Pillow at its fastest for the threaded path: decode only what a crop reads, read pixels without a copy.

:func:`jpeg_header` reads a JPEG's size and mode and :func:`decode_region` decodes a region of
it with feedfast's own extension (:mod:`feedfast.loader.backends.cpu.native`: libjpeg-turbo's skip and crop
of scanlines, the libjpeg Pillow uses); where it is not built, or for other images,
:func:`load_rows` decodes with Pillow down to the lowest row a crop reads.
:func:`exported_pixels` reads pixels without a copy. They lean on Pillow's plugin-level
interfaces (the ``tile`` list ``ImageFile.load`` decodes) and its Arrow C data export (Pillow
12 and later), and fall back to the plain calls where those do not apply;
``tests/test_native.py`` and ``tests/test_thread_epoch.py`` check them against the plain calls.
"""

from __future__ import annotations

import ctypes
import random
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedfast.loader.backends.cpu import native

REGION_FORMATS = frozenset({"JPEG", "MPO"})
"""Pillow's formats :func:`decode_region` reads (MPO: a camera JPEG with more pictures; the first is decoded)."""
REGION_MARGIN = 4
"""Pixels a region is widened by on every side: its outermost ring differs from a full decode (upsampling)."""

_MARK = bytes(random.Random(7).randrange(256) for _ in range(4099))


def load_rows(img: Any, rows: int) -> bool:
    """Decode a JPEG only down to row ``rows`` (rows below stay black); other images in full.

    libjpeg decodes top to bottom, so rows below the lowest one a crop reads are not worth
    decoding. Pillow decodes the rows of a shortened tile, then libjpeg reports "too few
    scanlines" and Pillow "broken data stream": expected. Whether the rows themselves decoded
    is told by the last one, filled beforehand with a mark that decoding overwrites. False
    when it did not (a damaged or truncated JPEG): the caller decodes in full to get the error.
    A JPEG damaged only below the rows a crop reads is delivered.
    """
    from PIL import Image

    tile = img.tile
    if img.format != "JPEG" or len(tile) != 1 or tile[0][0] != "jpeg" or rows >= tile[0][1][3] - tile[0][1][1]:
        img.load()
        return True
    x0, y0, x1, _ = tile[0][1]
    extents = (x0, y0, x1, y0 + rows)
    img.tile = [tile[0]._replace(extents=extents) if hasattr(tile[0], "_replace") else
                (tile[0][0], extents, *tile[0][2:])]
    img.load_prepare()
    width = img.width
    size = width * len(img.getbands())
    mark = (_MARK * (size // len(_MARK) + 1))[:size]
    img.im.paste(Image.frombytes(img.mode, (width, 1), mark).im, (0, rows - 1, width, rows))
    try:
        img.load()
    except OSError:
        img.tile = []
    return img.crop((0, rows - 1, width, rows)).tobytes() != mark


_JPEG_MODES = {(1, 1): "L", (3, 2): "RGB", (3, 3): "RGB"}
"""(components, libjpeg colour space) -> the mode Pillow opens a JPEG in, for the modes region decoding takes."""


@dataclass(frozen=True)
class JpegHeader:
    """What Pillow's ``Image.open`` tells of a JPEG that :func:`decode_region` can take, read by libjpeg."""

    size: tuple[int, int]
    mode: str
    format: str = "JPEG"


def jpeg_header(raw: bytes) -> JpegHeader | None:
    """The JPEG's size and mode from its frame header, in microseconds where Pillow's ``open`` takes tens.

    None where region decoding would not apply (not built, not a JPEG, CMYK, a header libjpeg
    cannot read): the caller then opens the file with Pillow, which says what is wrong. Pillow's
    decompression-bomb limit applies as in ``Image.open`` (an error above twice the limit, a
    warning above it).
    """
    from PIL import Image

    if native.ext is None or raw[:3] != b"\xff\xd8\xff":
        return None
    try:
        width, height, components, space = native.ext.jpeg_header(raw)
    except ValueError:
        return None
    mode = _JPEG_MODES.get((components, space))
    if mode is None or width < 1 or height < 1:
        return None
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        if width * height > 2 * limit:
            raise Image.DecompressionBombError(f"Image size ({width * height} pixels) exceeds limit of {2 * limit} "
                                               "pixels, could be decompression bomb DOS attack.")
        warnings.warn(f"Image size ({width * height} pixels) exceeds limit of {limit} pixels, could be decompression "
                      "bomb DOS attack.", Image.DecompressionBombWarning, stacklevel=2)
    return JpegHeader((width, height), mode)


def decode_region(img: Any, raw: bytes | memoryview, denom: int,
                  box: tuple[int, int, int, int]) -> tuple[Any, int, int] | None:
    """The pixels of ``box`` (left, top, right, bottom, in the image scaled by ``1 / denom``) of the JPEG ``raw``.

    ``img`` is Pillow's opened image or the :class:`JpegHeader` of ``raw``.

    Returns an image of the box (clamped to the image) and its origin in the scaled image:
    ``(image, left, top)``; its pixels equal Pillow's full decode (``img.draft`` at the same
    scale, then ``load``): the region decoded reaches :data:`REGION_MARGIN` pixels beyond the
    box, where a region's outermost ring differs. The image is ``RGBX`` (for an ``RGB``
    ``img``) or ``L``, a window onto the decoder's memory (never export it: crop or resize it
    first). None where the region decoder does not apply: not built, not a JPEG, another mode,
    or libjpeg reported an error or a warning (corrupt data); the caller then decodes with
    Pillow, which raises what is wrong.
    """
    from PIL import Image

    if native.ext is None or img.format not in REGION_FORMATS or img.mode not in ("RGB", "L"):
        return None
    left, top, right, bottom = box
    m = REGION_MARGIN
    try:
        pixels, x0, y0, width, height = native.ext.decode_region(raw, denom, max(0, left - m), max(0, top - m),
                                                                right + m, bottom + m, img.mode == "L")
    except ValueError:
        return None
    left, top = max(left, x0), max(top, y0)
    right, bottom = max(left + 1, min(right, x0 + width)), max(top + 1, min(bottom, y0 + height))
    mode, channels = ("RGBX", 4) if img.mode == "RGB" else ("L", 1)
    stride = width * channels
    window = memoryview(pixels)[(top - y0) * stride + (left - x0) * channels:]
    return Image.frombuffer(mode, (right - left, bottom - top), window, "raw", mode, stride, 1), left, top


class _ArrowSchema(ctypes.Structure):
    pass


class _ArrowArray(ctypes.Structure):
    pass


_ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_char_p), ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64), ("children", ctypes.POINTER(ctypes.POINTER(_ArrowSchema))),
    ("dictionary", ctypes.c_void_p), ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p)]
_ArrowArray._fields_ = [
    ("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64), ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))), ("dictionary", ctypes.c_void_p),
    ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p)]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


class _Exported:
    """A NumPy array interface over an image's memory that keeps the Arrow export alive."""

    def __init__(self, address: int, shape: tuple[int, ...], keep: Any) -> None:
        self.__array_interface__ = {"data": (address, True), "shape": shape, "typestr": "|u1", "version": 3}
        self._keep = keep


def exported_pixels(img: Any) -> np.ndarray:
    """The image's pixels as a uint8 HW or HWC array without a copy where Pillow can export them.

    Pillow (12 and later) exports an image held in one memory block through the Arrow C data
    interface: RGB and RGBX as a list of 4 bytes per pixel (the fourth dropped by a view).
    Elsewhere, ``np.asarray`` (one copy through ``tobytes``). RGBX gives its RGB bands.
    """
    if img.mode not in ("RGB", "RGBX") or img.readonly:  # exporting an "L" image, or one mapping another's
        return _plain(img)  # memory, crashed pillow-simd 12.1.1 here
    try:
        schema_capsule, array_capsule = img.__arrow_c_array__()
    except (AttributeError, ValueError):
        return _plain(img)
    schema = _ArrowSchema.from_address(_capsule_pointer(schema_capsule, b"arrow_schema"))
    array = _ArrowArray.from_address(_capsule_pointer(array_capsule, b"arrow_array"))
    width, height = img.size
    keep = (schema_capsule, array_capsule, img)
    if schema.format == b"+w:4" and not array.offset:
        child = array.children[0].contents
        if child.offset == 0 and child.length == width * height * 4:
            return np.asarray(_Exported(child.buffers[1], (height, width, 4), keep))[:, :, :3]
    return _plain(img)


def _plain(img: Any) -> np.ndarray:
    arr = np.asarray(img)
    return arr[:, :, :3] if img.mode == "RGBX" else arr
