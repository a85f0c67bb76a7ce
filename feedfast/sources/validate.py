"""Checking image components before a decoder sees them, so one bad file cannot fail a batch.

DALI fails a whole batch when one sample cannot be decoded, and it has no per-sample
skip. feedfast therefore checks image components once, when it indexes a shard, and
caches the verdicts next to the index. The rule is **delivered means decodable, whoever
decodes it**: an image is checked by both decoders that may read it (PIL, and DALI's CPU
decoder when DALI is installed), and

- ``ok``: both decode it (JPEG incl. CMYK and grayscale, PNG incl. 16-bit and alpha, and
  TIFF, BMP, PNM, JPEG 2000, WebP when both can): it is read from its shard.
- ``convert``: one of them decodes it and the other cannot (GIF, PSD, DDS, ICO and other
  PIL-only formats; JPEGs with junk DALI rejects; WebP, TIFF or JPEG 2000 that this PIL
  build lacks a codec for): it is re-encoded losslessly as PNG (from the decoder that
  reads it; first frame, or a layered file's composite; 16-bit scaled to 8) into a side
  shard, so it is delivered, not skipped, by either backend.
- ``bad``: zero bytes, not an image, truncated or corrupt (PIL says the bytes are broken,
  even when DALI would fill the rest with grey), more pixels than ``max_pixels``, a check
  that ran over its time limit, or a decoder that crashed; left out (``on_error: skip``)
  or raised naming shard and key (``on_error: raise``), with the reason.

Checks run in worker processes under a time limit per image (see
:mod:`feedfast.sources.checkworker`). Under ``on_error: raise`` only headers are read
(format and size), DALI decoding just the images PIL cannot open; an image DALI then
fails on is found and named after the failure. Under ``on_error: skip`` every image is
decoded by both decoders once (a JPEG by PIL at 1/8 scale: libjpeg's DCT scaling still
reads every byte of the entropy-coded data, so truncation is caught). A GPU run decodes
with nvJPEG, which may reject a file the CPU decoder accepts; such a file fails its
batch and is named. EXIF orientation is not applied by either backend (DALI ignores it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from feedfast.sources.decoders import DALI_FORMATS, DaliDecoder, Probe, pil_png, pil_probe, short

DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own decompression-bomb limit
SNIFF_BYTES = 65536
__all__ = ["DALI_FORMATS", "DEFAULT_MAX_PIXELS", "SNIFF_BYTES", "Verdict", "check_image", "probe_image", "to_png"]


@dataclass(frozen=True)
class Verdict:
    """What the check decided for one image component."""

    status: str  # "ok" | "convert" | "bad" (and "more": send the whole file, see check_image)
    reason: str = ""


def check_image(data: bytes, *, max_pixels: int, decode: bool, dali: DaliDecoder | None,
                complete: bool = True) -> Verdict:
    """The verdict on one image, asking PIL and (when given and available) DALI; never raises.

    Args:
        data: the image file, or with ``decode=False`` possibly only its first ``SNIFF_BYTES``.
        max_pixels: larger images are ``bad``.
        decode: decode the pixels (catches truncation and corruption); otherwise read the
            header only and ask DALI only about what PIL cannot open.
        dali: DALI's CPU decoder; None or unavailable: PIL decides alone.
        complete: ``data`` is the whole file; when not, and DALI must decide, the verdict is
            ``more`` (ask again with the whole file).
    """
    pil = pil_probe(data, max_pixels=max_pixels, decode=decode)
    if pil.kind == "limit":
        return Verdict("bad", pil.reason)
    use_dali = dali is not None and dali.available
    if not use_dali:
        return _pil_only(pil)
    if pil.ok and (not decode or pil.fmt not in DALI_FORMATS):
        return _pil_only(pil)
    if not complete:
        return Verdict("more")
    _, dali_reason = dali.decode(data)  # type: ignore[union-attr]
    if pil.ok and not dali_reason:
        return _pil_only(pil)
    if pil.ok:
        return Verdict("convert", f"DALI's CPU decoder rejects this {pil.fmt} ({dali_reason}); PIL reads it: "
                                  "re-encoded as PNG")
    if not dali_reason and pil.kind == "support":
        return Verdict("convert", f"decoded by DALI only ({pil.reason}); re-encoded as PNG")
    reason = pil.reason if pil.kind == "data" or not dali_reason else f"{pil.reason}; {dali_reason}"
    return Verdict("bad", reason if pil.kind != "data" else f"cannot decode: {reason}")


def _pil_only(pil: Probe) -> Verdict:
    if not pil.ok:
        return Verdict("bad", pil.reason if pil.kind != "data" else f"cannot decode: {pil.reason}")
    if pil.fmt not in DALI_FORMATS:
        return Verdict("convert", f"{pil.fmt} is not decodable by DALI; PIL reads it: re-encoded as PNG")
    return Verdict("ok")


def convert_image(data: bytes, dali: DaliDecoder | None) -> bytes | str:
    """PNG bytes of ``data`` decoded by PIL, else by DALI; a reason string when neither can."""
    try:
        return pil_png(data)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a verdict
        pil_reason = f"PIL: {short(exc)}"
    if dali is None or not dali.available:
        return f"cannot re-encode: {pil_reason}"
    pixels, reason = dali.decode(data)
    if pixels is None:
        return f"cannot re-encode: {pil_reason}; {reason}"
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


def answer(job: tuple[Any, ...], dali: DaliDecoder | None) -> Any:
    """A check worker's answer to one job (see :mod:`feedfast.sources.checkworker`)."""
    if job[0] == "check":
        complete = job[4] if len(job) > 4 else True
        return check_image(job[1], max_pixels=job[2], decode=job[3], dali=dali, complete=complete)
    if job[0] == "png":
        return convert_image(job[1], dali)
    raise ValueError(f"unknown check job {job[0]!r}")


def probe_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, decode: bool = True) -> Verdict:
    """Decide whether ``data`` is delivered, re-encoded or bad, in a check worker under the time limit."""
    from feedfast.sources.checkworker import Failed, pool

    (result,) = pool().map([("check", data, max_pixels, decode)])
    return Verdict("bad", result.reason) if isinstance(result, Failed) else result


def to_png(data: bytes) -> bytes:
    """Re-encode an image as PNG (see :func:`convert_image`), in a check worker under the time limit.

    Raises:
        ValueError: neither decoder can read it, or the time limit ran out; the message says why.
    """
    from feedfast.sources.checkworker import Failed, pool

    (result,) = pool().map([("png", data)])
    if isinstance(result, Failed):
        raise ValueError(result.reason)
    if isinstance(result, str):
        raise ValueError(result)
    return result
