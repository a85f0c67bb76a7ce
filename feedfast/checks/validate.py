"""Checking image components before a decoder sees them, so one bad file cannot fail a batch.

DALI fails a whole batch when one sample cannot be decoded, and it has no per-sample
skip. feedfast therefore checks image components once, when it indexes a shard, and
caches the verdicts next to the index. The rule is **delivered means decodable, whoever
decodes it**: an image is checked by both decoders that may read it (PIL, and DALI's CPU
decoder when DALI is installed), and

- ``ok``: both decode it (JPEG incl. CMYK and grayscale, PNG incl. 16-bit and alpha, and
  TIFF, BMP, PNM, JPEG 2000, WebP when both can): it is read from its shard.
- ``convert``: one of them decodes it and the other cannot (GIF, PSD, DDS, ICO, TGA, SGI
  and other PIL-only formats; PNGs with bad checksums, JPEGs and signed TIFFs DALI rejects; WebP, TIFF
  or JPEG 2000 that this PIL build lacks a codec for, seen from the header), or DALI
  decodes it only after one of its decoders failed and printed an ``[ERROR]`` line (a
  CMYK TIFF): it is re-encoded losslessly as PNG (by PIL, else from DALI's pixels; the
  first frame, or a layered file's composite; 16-bit scaled to 8 bits) into a side shard,
  so it is delivered, not skipped, by either backend, and the run prints nothing.
- ``bad``: zero bytes, not an image, truncated or corrupt (PIL says the bytes are broken,
  even when DALI would fill the rest with grey), more pixels than ``max_pixels``, a check
  that ran over its time limit, or a decoder that crashed; left out (``on_error: skip``)
  or raised naming shard and key (``on_error: raise``), with the reason.

Checks run in worker processes, a few images at once, each under a time limit of
``source.check_seconds`` (default 2 s; see :mod:`feedfast.checks.worker`): a check that
runs longer is ``bad`` ("a hostile or huge file"), so a fuzzed file costs at most that. The
pixel limit is read from the header before any decoding. Under ``on_error: raise`` only headers
are read (format and size), DALI decoding just the images PIL cannot open; an image DALI then
fails on mid-decode fails its batch, and the DALI backend rescues it: PIL decodes it, DALI is
fed its PNG, and the epoch goes on in the same order (:mod:`feedfast.loader.backends.dali.rescue`); one that
neither decodes is raised, naming shard and key. Under ``on_error: skip`` every image is
decoded by both decoders once (a JPEG by PIL at 1/8 scale: libjpeg's DCT scaling still
reads every byte of the entropy-coded data, so truncation is caught). A GPU run decodes
with nvJPEG, which may reject a file the CPU decoder accepts; such a file fails its
batch and is named. EXIF orientation is not applied by either backend (DALI ignores it).
"""

from __future__ import annotations

from feedfast.checks.decoders import DALI_FORMATS, Verdict, check_image

DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own decompression-bomb limit
SNIFF_BYTES = 65536
__all__ = ["DALI_FORMATS", "DEFAULT_MAX_PIXELS", "SNIFF_BYTES", "Verdict", "check_image", "probe_image", "to_png"]


def probe_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, decode: bool = True) -> Verdict:
    """Decide whether ``data`` is delivered, re-encoded or bad, in a check worker under the time limit."""
    from feedfast.checks.worker import Failed, pool

    (result,) = pool().map([("check", data, max_pixels, decode)])
    return Verdict("bad", result.reason) if isinstance(result, Failed) else result


def to_png(data: bytes) -> bytes:
    """Re-encode an image as PNG (see :func:`~feedfast.checks.decoders.convert_image`), in a check worker
    under the time limit.

    Raises:
        ValueError: neither decoder can read it, or the time limit ran out; the message says why.
    """
    from feedfast.checks.worker import Failed, pool

    (result,) = pool().map([("png", data)])
    if isinstance(result, Failed):
        raise ValueError(result.reason)
    if isinstance(result, str):
        raise ValueError(result)
    return result
