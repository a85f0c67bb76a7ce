"""Checking image components before DALI sees them, so one bad file cannot fail a batch.

DALI fails a whole batch when one sample cannot be decoded, and it has no per-sample
skip. feedfast therefore checks image components once, when it indexes a shard for a
spec with ``on_error: skip``, and caches the verdicts next to the index:

- ``ok``: DALI decodes it (JPEG incl. CMYK and grayscale, PNG incl. 16-bit and alpha,
  TIFF, BMP, PNM, JPEG 2000, WebP).
- ``convert``: PIL decodes it but DALI cannot (GIF, and other PIL-only formats); it is
  re-encoded losslessly as PNG into a side shard, so it is delivered, not skipped. An
  animated GIF contributes its first frame.
- ``bad``: zero bytes, not an image, truncated or corrupt, or more pixels than
  ``max_pixels`` (a decompression bomb); left out and reported with the reason.

Under ``on_error: raise`` only headers are read (format and size: GIFs still get
re-encoded, and an over-large image is an error naming it before the first batch); an
image DALI then fails on is found and named after the failure. Under ``on_error: skip``
every image is decoded once. A JPEG is decoded at 1/8 scale (libjpeg's DCT scaling still reads every byte of the
entropy-coded data, so truncation is caught) at about a tenth of the cost of a full decode.
EXIF orientation is not applied by either backend (DALI ignores it); rotate images when
making shards if orientation matters.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

DALI_FORMATS = frozenset({"JPEG", "MPO", "PNG", "TIFF", "BMP", "PPM", "JPEG2000", "WEBP"})
DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own decompression-bomb limit


@dataclass(frozen=True)
class Verdict:
    """What the check decided for one image component."""

    status: str  # "ok" | "convert" | "bad"
    reason: str = ""


SNIFF_BYTES = 65536


def probe_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, decode: bool = True) -> Verdict:
    """Decide whether DALI can decode ``data``.

    Args:
        data: the image file, or with ``decode=False`` at least its first ``SNIFF_BYTES``.
        max_pixels: larger images are ``bad``.
        decode: decode the pixels (catches truncation and corruption); otherwise read the
            header only (format and size).
    """
    from PIL import Image

    if not data:
        return Verdict("bad", "zero-byte image")
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max(max_pixels, limit or 0)  # our limit decides; checks run in one thread
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            w, h = img.size
            if w * h > max_pixels:
                return Verdict("bad", f"image of {w}x{h} = {w * h} pixels exceeds max_pixels={max_pixels}")
            fmt = img.format or "?"
            if decode:
                if fmt == "JPEG":
                    img.draft("RGB", (max(1, w // 8), max(1, h // 8)))
                img.load()
    except Image.DecompressionBombError as exc:
        return Verdict("bad", f"decompression bomb: {exc}")
    except Image.DecompressionBombWarning as exc:
        return Verdict("bad", f"decompression bomb: {exc}")
    except Image.UnidentifiedImageError:
        return Verdict("bad", "not an image file (no known image format)")
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        return Verdict("bad", f"cannot decode: {_short(exc)}")
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    if fmt not in DALI_FORMATS:
        return Verdict("convert", f"{fmt} is not decodable by DALI; re-encoded as PNG")
    return Verdict("ok")


def to_png(data: bytes) -> bytes:
    """Re-encode an image PIL can read as a PNG (first frame; RGB, RGBA or L)."""
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img.seek(0)
    mode = "RGBA" if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info else "RGB"
    if img.mode in ("L", "1"):
        mode = "L"
    out = io.BytesIO()
    img.convert(mode).save(out, "PNG", compress_level=1)
    return out.getvalue()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]
