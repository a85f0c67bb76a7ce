"""feedfast's C extension (``feedfast/_native.c``), where it was built: the threaded path's hot loops.

It reads a JPEG's header (microseconds) and decodes a region of it (used through
:func:`feedfast.loader.backends.cpu.pil_fast.jpeg_header` and :func:`~feedfast.loader.backends.cpu.pil_fast.decode_region`),
runs ``normalize`` in one pass (:func:`normalize_into`), and resizes as Pillow's
``Image.resize`` does, bit for bit (:func:`resample_into`; ``feedfast/_resample.c``), or all of
a sample at once: region decoding, resize, flips and ``normalize`` into the batch's slot
(:func:`sample_into`); all release the GIL. The extension is optional: an install without
libjpeg-turbo's headers goes on without it, and the threaded path then runs those steps in
Pillow and NumPy, with the same pixels and the same floats (``tests/test_native.py``,
``tests/test_native_resample.py``).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

try:
    from feedfast import _native as ext
except ImportError:  # not built at install: Pillow and NumPy do the work
    ext = None


def built() -> bool:
    """Whether the extension is built and loads here."""
    return ext is not None


def libjpeg_turbo_version() -> str | None:
    """The libjpeg-turbo version the extension was built against (``"2.1.5"``), None when not built."""
    number = getattr(ext, "LIBJPEG_TURBO_VERSION_NUMBER", None)
    if number is None:
        return None
    return f"{number // 1000000}.{number // 1000 % 1000}.{number % 1000}"


def normalize_into(pixels: np.ndarray, out: np.ndarray, mean: np.ndarray, inv: np.ndarray, chw: bool) -> bool:
    """``out = (pixels - mean) * inv`` in one pass, as NumPy computes it in float32; False when not built.

    Args:
        pixels: uint8 H x W x C, any strides.
        out: C-contiguous float32, C x H x W when ``chw``, else H x W x C.
        mean, inv: float32, one value per channel, contiguous.
    """
    if ext is None or out.dtype != np.float32 or not out.flags.c_contiguous:
        return False
    ext.normalize_into(pixels, out, mean, inv, chw)
    return True


FLAVOURS = {"pillow": 0, "pillow-simd": 1}
"""The resizers the extension reproduces (``feedfast/_resample.h``): Pillow up to 12 (22-bit coefficients) and
pillow-simd (16-bit coefficients, another rounding of its 1x3 reduction); they differ by a grey level here and
there. Pillow 13 orders its passes by a rule not ported: neither matches it, and resizing stays with Pillow."""


@functools.cache
def resample_flavour() -> int | None:
    """The :data:`FLAVOURS` value whose pixels equal the installed Pillow's ``resize``, None if none does.

    Decided once, by resizing a few probe images both ways (the cases where the flavours differ);
    None also where the extension is not built. :func:`resample_into` and :func:`sample_into` return
    False when this is None, and the caller resizes with Pillow.
    """
    if ext is None:
        return None
    from PIL import Image

    rng = np.random.default_rng(22)
    rgb = Image.fromarray(rng.integers(0, 256, (23, 29, 3), dtype=np.uint8))
    probes: list[tuple[Any, tuple[int, int], int, tuple[float, float, float, float], float | None]] = [
        (rgb, (13, 11), Image.Resampling.LANCZOS, (1.5, 2.25, 27.75, 21.5), None),
        (rgb.convert("L"), (17, 9), Image.Resampling.BICUBIC, (0.0, 0.5, 28.0, 23.0), None),
        (rgb, (29, 2), Image.Resampling.BILINEAR, (0.0, 0.0, 29.0, 23.0), 2.0),  # pillow-simd's 1x3 reduction
        (Image.fromarray(rng.integers(0, 256, (42, 58), dtype=np.uint8)), (53, 12), Image.Resampling.BOX,
         (0.0, 0.0, 58.0, 42.0), None),  # Pillow 13 resizes this vertically first
    ]
    for flavour in FLAVOURS.values():
        if all(np.array_equal(_probe(ext, img, size, resample, box, gap, flavour),
                              _channels(np.asarray(img.resize(size, resample, box=box, reducing_gap=gap))))
               for img, size, resample, box, gap in probes):
            return flavour
    return None


def _channels(arr: np.ndarray) -> np.ndarray:
    return arr[:, :, None] if arr.ndim == 2 else arr


def _probe(module: Any, img: Any, size: tuple[int, int], resample: int, box: tuple[float, float, float, float],
           gap: float | None, flavour: int) -> np.ndarray:
    pixels = img.convert("RGBX").tobytes() if img.mode == "RGB" else img.tobytes()
    pixel = 4 if img.mode == "RGB" else 1
    out = np.empty((size[1], size[0], 3 if pixel == 4 else 1), dtype=np.uint8)
    module.resample_into(pixels, img.width, img.height, pixel, img.width * pixel, box, resample, gap or 0.0, False,
                         False, out, None, None, False, flavour)
    return out


def resample_into(pixels: Any, width: int, height: int, pixel: int, stride: int, *, out: np.ndarray,
                  box: tuple[float, float, float, float], resample: int, reducing_gap: float | None = None,
                  hflip: bool = False, vflip: bool = False, mean: np.ndarray | None = None,
                  inv: np.ndarray | None = None, chw: bool = False) -> bool:
    """Pillow's ``img.resize(size, resample, box=box, reducing_gap=reducing_gap)`` into ``out``; False when the
    extension is not built or does not reproduce the installed Pillow (:func:`resample_flavour`).

    The GIL is released for the whole call. Pixels equal Pillow's bit for bit (``L``, and ``RGB`` or
    ``RGBX`` stored as 4 bytes a pixel, every filter, reducing_gap included), then are flipped as
    asked, and normalized for a float ``out`` as :func:`normalize_into` does (float16: rounded to
    nearest even from those float32, as NumPy's ``astype``).

    Args:
        pixels: the image, any buffer: ``height`` rows ``stride`` bytes apart, ``width`` pixels of
            ``pixel`` bytes each (1: ``L``; 4: ``RGB``/``RGBX``, the fourth byte ignored).
        out: C-contiguous, its shape the output size: uint8 H x W x C, or float32/float16 C x H x W
            (``chw``) or H x W x C, with C 1 for 1-byte pixels and 3 for 4-byte ones.
        box: the region of the image resized (x0, y0, x1, y1), floats, within the image.
        resample: Pillow's filter number (``Image.Resampling``: NEAREST 0 to HAMMING 5).
        reducing_gap: Pillow's (None: no reduction first).
        hflip, vflip: mirror the result left-right, top-bottom.
        mean, inv: float32, one per channel, for a float ``out`` (``((float)pixel - mean) * inv``); None for uint8.

    Raises:
        ValueError: what Pillow raises for the box or filter, or a mismatch of ``out``, ``mean`` or ``inv``.
    """
    flavour = resample_flavour()
    if flavour is None or ext is None:
        return False
    ext.resample_into(pixels, width, height, pixel, stride, box, resample, reducing_gap or 0.0, hflip, vflip, out,
                      mean, inv, chw, flavour)
    return True


def sample_into(raw: bytes, *, denom: int, gray: bool, region: tuple[int, int, int, int],
                window: tuple[int, int, int, int], box: tuple[float, float, float, float], out: np.ndarray,
                resample: int, reducing_gap: float | None = None, hflip: bool = False, vflip: bool = False,
                mean: np.ndarray | None = None, inv: np.ndarray | None = None, chw: bool = False) -> bool:
    """A whole sample in one call without the GIL: ``decode_region``, then :func:`resample_into` of a window of it.

    What it computes equals ``pil_fast.decode_region(img, raw, denom, region)`` (less its margin: pass
    the region with it), cropped to ``window``, resized over ``box`` (made relative to the window and
    clamped to it, as ``thread_sample`` does), flipped and normalized. False when
    :func:`resample_into` would be.

    Args:
        raw: the JPEG's bytes.
        denom: DCT scaling, 1, 2, 4 or 8; every coordinate below is in the image scaled by it.
        gray: decode to ``L``, else ``RGB``.
        region: (left, top, right, bottom) to decode, clamped to the image (libjpeg-turbo may widen it left).
        window: (left, top, right, bottom), the image the resize sees: cut to what was decoded.
        box, out, resample, reducing_gap, hflip, vflip, mean, inv, chw: as in :func:`resample_into`, ``box``
            in the scaled image's coordinates.

    Raises:
        ValueError: libjpeg's message (corrupt data, a warning), or as :func:`resample_into` raises.
    """
    flavour = resample_flavour()
    if flavour is None or ext is None:
        return False
    ext.sample_into(raw, denom, gray, region, window, box, resample, reducing_gap or 0.0, hflip, vflip, out, mean,
                    inv, chw, flavour)
    return True
