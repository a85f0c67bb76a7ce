"""feedfast's C extension (``feedfast/_native.c``), where it was built: the threaded path's hot loops.

It reads a JPEG's header (microseconds) and decodes a region of it (used through
:func:`feedfast.loader.pil_fast.jpeg_header` and :func:`~feedfast.loader.pil_fast.decode_region`),
and runs ``normalize`` in one pass (:func:`normalize_into`); decoding and normalize release
the GIL. The extension is optional: an install without libjpeg-turbo's headers goes on
without it, and the threaded path then runs those steps in Pillow and NumPy, with the same
pixels and the same floats (``tests/test_native.py``).
"""

from __future__ import annotations

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
