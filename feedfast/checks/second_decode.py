"""A second opinion: DALI's CPU decoder on an image that pillow-simd rejects.

The rule is *delivered means decodable, whoever decodes it* (see :mod:`feedfast.checks.validate`):
an image that DALI decodes is delivered by every backend, not only by the DALI backend.
pillow-simd's limits are not the data's: its libjpeg-turbo 2.1 stops at a stray marker in a
JPEG's data that DALI's decoder reads past, and cannot read a lossless (SOF3) JPEG at all. So
where the ``pil`` backend or the threaded path fails to decode a component, it asks this
module, and delivers DALI's pixels in the colour the spec asks for, or raises the sample's
error with both decoders' reasons.

The decode runs in a check worker (:mod:`feedfast.checks.worker`: a process of its own,
started on first use, one per process that asks), under ``source.check_seconds`` of CPU
time, with DALI's terminal output captured: a file PIL already called broken is suspect, and
a decoder that loops, crashes or prints on it costs the sample, never the training process.
The first call waits about a second for the worker to import DALI; the path is taken only for
images PIL rejects.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import numpy as np

from feedfast.checks.worker import CheckPool, Failed
from feedfast.ops.generic import DecodeFailure
from feedfast.spec.model import CHECK_SECONDS

DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own decompression-bomb limit (as feedfast.checks.validate's)
COLORS = ("rgb", "gray", "any")

_POOL: CheckPool | None = None


def _pool() -> CheckPool:
    """This process's one-worker pool for second opinions (a forked child starts its own)."""
    global _POOL
    if _POOL is not None and _POOL._pid != os.getpid():
        _POOL = None  # forked (a DataLoader worker): the parent's worker pipes are not this process's
    if _POOL is None:
        _POOL = CheckPool(1)
        atexit.register(_POOL.close)
    return _POOL


def second_opinion(data: bytes, *, color: str = "rgb", max_pixels: int = DEFAULT_MAX_PIXELS,
                   seconds: float = CHECK_SECONDS) -> tuple[np.ndarray | None, str]:
    """DALI's pixels of ``data``: (HWC uint8 array, "") with 3 channels for ``rgb``, 1 for ``gray``, the
    file's own for ``any``, or (None, DALI's reason) when DALI cannot decode it either, ran past ``seconds`` of CPU time, or is
    not installed. Never raises for the data's sake.
    """
    if color not in COLORS:
        raise ValueError(f"color must be one of {COLORS}, not {color!r}")
    if not data:
        return None, "the component is empty"
    (answer,) = _pool().map([("decode", bytes(data), max_pixels, color)], labels=["a second opinion"],
                            seconds=seconds)
    if isinstance(answer, Failed):
        return None, f"DALI: {answer.reason}"
    if isinstance(answer, str):
        return None, answer
    return answer, ""


def decode_second(data: bytes, *, color: str = "rgb", max_pixels: int = DEFAULT_MAX_PIXELS,
                  seconds: float = CHECK_SECONDS) -> np.ndarray | None:
    """DALI's HWC uint8 pixels of ``data`` in ``color`` (``rgb``: 3 channels, ``gray``: 1), or None."""
    return second_opinion(data, color=color, max_pixels=max_pixels, seconds=seconds)[0]


def second_image(data: bytes, *, color: str, failed: str, max_pixels: int = DEFAULT_MAX_PIXELS,
                 seconds: float = CHECK_SECONDS) -> Any:
    """The image PIL could not decode, decoded by DALI: a loaded PIL image in mode ``RGB`` or ``L``.

    Args:
        data: the component's raw bytes (the whole file).
        color: the decode op's ``color`` parameter, ``rgb`` or ``gray``.
        failed: why PIL failed, for the error when DALI fails too (e.g. ``"OSError: broken data stream"``).
        max_pixels: a larger image is refused from its header.
        seconds: the CPU time the decode may take (the spec's ``source.check_seconds``).

    Raises:
        DecodeFailure: DALI cannot decode it either; the message gives both reasons.
    """
    from PIL import Image

    pixels, reason = second_opinion(data, color=color, max_pixels=max_pixels, seconds=seconds)
    if pixels is None:
        raise DecodeFailure(f"cannot decode the image ({failed}; {reason})")
    return Image.fromarray(pixels[:, :, 0], "L") if pixels.shape[2] == 1 else Image.fromarray(pixels, "RGB")


def as_ppm(pixels: np.ndarray) -> bytes:
    """Lossless, uncompressed PPM (RGB) or PGM (grey) bytes of HWC uint8 pixels, which PIL opens at once."""
    h, w, channels = pixels.shape
    return f"P{6 if channels == 3 else 5}\n{w} {h}\n255\n".encode("ascii") + np.ascontiguousarray(pixels).tobytes()


def rescue_png(data: bytes, *, seconds: float = CHECK_SECONDS) -> bytes:
    """PNG bytes of an image for DALI to decode in its place: PIL's re-encoding
    (:func:`~feedfast.checks.decoders.pil_png`), else DALI's own pixels in the file's colours (a lossless
    grey JPEG, which DALI's decoder refuses as RGB and PIL cannot read).

    Raises:
        ValueError: neither decoder reads it; the message gives both reasons.
    """
    from feedfast.checks.decoders import pil_png, png_of, short

    try:
        return pil_png(data)
    except Exception as exc:  # noqa: BLE001 - any decoder failure asks DALI
        failed = short(exc)
    pixels, reason = second_opinion(data, color="any", seconds=seconds)
    if pixels is None:
        raise ValueError(f"cannot re-encode the image (PIL: {failed}; {reason})")
    return png_of(pixels)
