"""The decoders a verdict asks (PIL and DALI's CPU decoder, one image at a time) and the verdict.

The rules are in :mod:`feedfast.checks.validate`. These functions run inside a check
worker (:mod:`feedfast.checks.worker`; this file is its program), a separate process, because a hostile file can make a decoder loop for tens of seconds,
print to the terminal or crash the process. Every exception of every class a decoder
raises becomes a :class:`Probe` with a reason; nothing here raises.

``Probe.kind`` says why PIL failed: ``data`` (PIL calls the bytes broken: truncated, corrupt),
``support`` (this PIL build cannot read the format: no codec, an unimplemented variant,
an unknown format) or ``limit`` (empty, or more pixels than allowed). Any failure but a
``limit`` lets DALI's success deliver the image, re-encoded: pillow-simd's limits are not
the data's (libjpeg-turbo 2.1 stops at a stray marker that DALI's decoder reads past, and
cannot read a lossless JPEG). DALI 2.4's CPU decoder refuses a truncated JPEG (it fills no
rows with grey), so truncation stays ``bad``.

A JPEG of many scans (:data:`PLAIN_SCANS`) is decoded even by a header check: each scan
walks every block of the image, so 5,000 empty progressive scans over 67 MP decode for a
minute from 741 KB; the check's time limit then stops it before any loader decodes it.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import struct
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import IO, Any, Iterator

DALI_FORMATS = frozenset({"JPEG", "MPO", "PNG", "TIFF", "BMP", "PPM", "JPEG2000", "WEBP"})
PLAIN_SCANS = 64
"""More scans than this (encoders write 1 to about 12) and a header check decodes the JPEG under the time limit."""


@dataclass(frozen=True)
class Probe:
    """What one decoder made of one image: ``ok`` with PIL's format name, or a failure ``kind`` and reason."""

    ok: bool
    fmt: str = ""
    kind: str = ""  # "" | "data" | "support" | "limit"
    reason: str = ""


def short(exc: BaseException) -> str:
    """``Type: first line`` of an exception, at most 200 characters (object addresses left out)."""
    text = str(exc).strip().splitlines()
    line = re.sub(r"\s*<[^<>]* at 0x[0-9a-f]+>", "", text[0] if text else "")
    return f"{type(exc).__name__}: {line}"[:200]


_SUPPORT_TEXT = ("not available", "not supported", "unsupported", "unimplemented", "cannot identify", "unknown")


def _pil_kind(exc: BaseException) -> str:
    from PIL import Image

    if isinstance(exc, (Image.UnidentifiedImageError, ImportError, NotImplementedError)):
        return "support"
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning, MemoryError)):
        return "limit"
    text = str(exc).lower()
    return "support" if any(t in text for t in _SUPPORT_TEXT) else "data"


def pil_probe(data: bytes, *, max_pixels: int, decode: bool) -> Probe:
    """Open ``data`` with PIL: header, pixel count, and with ``decode`` the pixels (JPEG at 1/8 scale)."""
    with pil_quiet():
        return _pil_probe(data, max_pixels, decode)


@contextmanager
def pil_quiet() -> Iterator[None]:
    """PIL's own pixel limit off (the check's ``max_pixels`` decides, from the header) and its warnings
    ignored, for what is checked inside (a batch of header checks sets them once for all its images)."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def _pil_probe(data: bytes, max_pixels: int, decode: bool) -> Probe:
    """:func:`pil_probe` inside :func:`pil_quiet`."""
    from PIL import Image

    if not data:
        return Probe(False, kind="limit", reason="zero-byte image")
    try:
        img = open_image(data)
        w, h = img.size
        if w * h > max_pixels:
            return Probe(False, img.format or "?", "limit",
                         f"image of {w}x{h} = {w * h} pixels exceeds max_pixels={max_pixels}")
        fmt = img.format or "?"
        missing = _missing_decoders(img)
        if missing:  # known from the header alone: this PIL build lacks the codec (e.g. libtiff, libwebp)
            return Probe(False, fmt, "support", f"PIL: decoder {missing} not available")
        if decode:
            if fmt == "JPEG":
                img.draft("RGB", (max(1, w // 8), max(1, h // 8)))
            img.load()
            to_8bit(img).convert("RGB")  # what the PIL backend does next (LAB, ICC and odd modes fail here)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a verdict, whatever its class
        if isinstance(exc, Image.UnidentifiedImageError):
            return Probe(False, kind="support", reason="not an image file PIL knows (no known image format)")
        return Probe(False, kind=_pil_kind(exc), reason=f"PIL: {short(exc)}")
    return Probe(True, fmt)


def _missing_decoders(img: Any) -> str:
    """The name of a decoder the image's tiles need that this PIL build lacks ("" when none)."""
    from PIL import Image

    for tile in getattr(img, "tile", None) or ():
        name = tile[0]
        if name not in Image.DECODERS and not hasattr(Image.core, f"{name}_decoder"):
            return str(name)
    return ""


PIL_CODECS = {
    "jpg": "JPEG", "zlib": "PNG", "libtiff": "compressed TIFF (LZW, Deflate, LZMA, JPEG-in-TIFF)", "webp": "WebP",
    "jpg_2000": "JPEG 2000", "littlecms2": "ICC colour management (LAB and ICC-profiled images in the pil backend)",
}
IMAGE_CODECS = {"jpg": "libjpeg-dev", "zlib": "zlib1g-dev", "libtiff": "libtiff-dev", "jpg_2000": "libopenjp2-7-dev",
                "webp": "libwebp-dev"}
"""The PIL codecs without which images are lost, and the Debian/Ubuntu package of each one's headers."""


def pil_codecs() -> dict[str, tuple[bool, str]]:
    """{PIL feature: (present, what it reads)}: what ``feedfast doctor`` lists. A missing image codec
    (:data:`IMAGE_CODECS`) loses images: DALI's CPU decoder cannot read every TIFF (LZMA, old-style
    JPEG) or JPEG 2000 that stock Pillow reads, so such files are left out or raised."""
    from PIL import features

    out = {}
    for name, what in PIL_CODECS.items():
        try:
            present = bool(features.check(name))
        except Exception:  # noqa: BLE001 - an unknown feature name on an old PIL is "missing"
            present = False
        out[name] = (present, what)
    return out


def pil_png(data: bytes) -> bytes:
    """Re-encode an image PIL reads as PNG: its first frame (or the composite of a layered
    file), 16-bit scaled to 8, in RGB, RGBA or L."""

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        img = open_image(data)
        img.load()  # the first frame, or a PSD's composite: never seek (PSD has no frame 0 to seek back to)
        img = to_8bit(img)
        out = io.BytesIO()
        img.save(out, "PNG", compress_level=1)
    return out.getvalue()


TIFF_MAGIC = (b"II*\x00", b"MM\x00*")


def open_image(data: bytes) -> Any:
    """``Image.open`` of ``data`` (not yet loaded), with one fallback for TIFFs.

    A TIFF of separate planes (PlanarConfiguration 2) whose extra samples are all "unspecified"
    (ExtraSamples 0: no alpha, nothing to show) is refused by PIL before 12.2 ("cannot identify
    image file": no mode has the extra bands), and by DALI's libtiff decoder when its samples are
    signed. Pillow 12.2 reads it without the extra planes (Pillow's test image
    ``separate_planar_extra_samples.tiff``); so does this fallback on any PIL, also uncompressed
    (PIL then reads the planes' strips itself, and is given only those of the bands it keeps).

    Raises:
        PIL.UnidentifiedImageError: as ``Image.open``, when the fallback does not read it either.
        PIL.Image.DecompressionBombError: as ``Image.open``.
    """
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError:  # grey or 5+ samples: no mode has the extra bands
        if not data.startswith(TIFF_MAGIC):
            raise
        try:
            img = _planar_tiff_class()(io.BytesIO(data))
        except Exception:  # noqa: BLE001 - not such a TIFF, or broken: PIL's own error stands
            img = None
        if img is None or not img.dropped_planes:
            raise
    else:  # RGB + 1: opened as RGBX, whose planes PIL cannot then decode ("unknown raw mode", "decoder error -2")
        if img.format != "TIFF" or not _planar_extra(img):
            return img
        try:
            img = _planar_tiff_class()(io.BytesIO(data))
        except Exception:  # noqa: BLE001 - broken otherwise: PIL's own reading (and error) stands
            return img
    check = getattr(Image, "_decompression_bomb_check", None)  # what Image.open does after opening
    if check is not None:
        check(img.size)
    return img


def _planar_extra(img: Any) -> bool:
    """Whether a TIFF opened by PIL has separate planes and unspecified extra samples (PIL < 12.2 keeps them)."""
    from PIL import TiffImagePlugin as tiff

    tags = getattr(img, "tag_v2", None)
    if tags is None or tags.get(tiff.PLANAR_CONFIGURATION, 1) != 2:
        return False
    extra = tuple(tags.get(tiff.EXTRASAMPLES, ()))
    return bool(extra) and max(extra) == 0


@lru_cache(maxsize=1)
def _planar_tiff_class() -> type:
    """A ``TiffImageFile`` that leaves out the trailing unspecified extra samples of separate planes."""
    from PIL import TiffImagePlugin as tiff

    class PlanarExtraTiff(tiff.TiffImageFile):  # type: ignore[misc]
        dropped_planes = 0

        def _setup(self) -> None:
            tags = self.tag_v2
            extra = tuple(tags.get(tiff.EXTRASAMPLES, ()))
            samples = tags.get(tiff.SAMPLESPERPIXEL, 1)
            if tags.get(tiff.PLANAR_CONFIGURATION, 1) == 2 and extra and max(extra) == 0 \
                    and isinstance(samples, int) and samples > len(extra):
                keep = samples - len(extra)
                bits = tuple(tags.get(tiff.BITSPERSAMPLE, (1,)))
                if len(bits) > 1:
                    tags[tiff.BITSPERSAMPLE] = bits[:keep]
                formats = tuple(tags.get(tiff.SAMPLEFORMAT, ()))
                if len(formats) > 1:  # one value for all kept bands, as PIL reads one pixel type
                    formats = formats[:keep]
                    tags[tiff.SAMPLEFORMAT] = formats[:1] if len(set(formats)) == 1 else formats
                for offsets_tag, counts_tag in ((tiff.STRIPOFFSETS, tiff.STRIPBYTECOUNTS),
                                                (tiff.TILEOFFSETS, tiff.TILEBYTECOUNTS)):
                    offsets = tags.get(offsets_tag)
                    if isinstance(offsets, tuple) and len(offsets) % samples == 0:  # plane after plane
                        kept = len(offsets) // samples * keep
                        tags[offsets_tag] = offsets[:kept]
                        counts = tags.get(counts_tag)
                        if isinstance(counts, tuple) and len(counts) == len(offsets):
                            tags[counts_tag] = counts[:kept]
                tags[tiff.SAMPLESPERPIXEL] = keep
                del tags[tiff.EXTRASAMPLES]
                self.dropped_planes = len(extra)
            super()._setup()

    return PlanarExtraTiff


def to_8bit(img: Any) -> Any:
    """``img`` in L, RGB or RGBA with 8 bits per channel; 16-bit and 32-bit grey are scaled, not clipped."""
    import numpy as np
    from PIL import Image

    mode = img.mode
    if mode in ("L", "RGB", "RGBA"):
        return img
    if mode.startswith("I;16") or mode == "I":
        arr = np.asarray(img)
        arr = arr.astype(np.uint32) >> 8 if mode.startswith("I;16") or arr.max(initial=0) > 255 else arr
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "L")
    if mode == "F":
        arr = np.asarray(img, dtype=np.float32)
        scale = 255.0 if arr.max(initial=0.0) <= 1.0 else 1.0
        return Image.fromarray(np.clip(arr * scale, 0, 255).astype(np.uint8), "L")
    if mode in ("1", "LA") and "transparency" not in img.info:
        return img.convert("L") if mode == "1" else img.convert("RGBA")
    alpha = mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in img.info
    return img.convert("RGBA" if alpha else "RGB")


@dataclass(frozen=True)
class Verdict:
    """What the check decided for one image component."""

    status: str  # "ok" | "convert" | "bad" (and "more", "whole": send the whole file, see check_image)
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
            ``more`` (ask again with the whole file); for a progressive JPEG it is ``whole`` (ask
            again with the whole file, header only: its scans are counted, and one of more than
            :data:`PLAIN_SCANS` is decoded under the time limit).
    """
    return _verdict(data, max_pixels, decode, dali, complete, pil_probe(data, max_pixels=max_pixels, decode=decode))


def _verdict(data: bytes, max_pixels: int, decode: bool, dali: DaliDecoder | None, complete: bool,
             pil: Probe) -> Verdict:
    """check_image's verdict, given PIL's probe of the image (of its header only, without ``decode``)."""
    if pil.kind == "limit":
        return Verdict("bad", pil.reason)
    if not decode and pil.ok and pil.fmt in ("JPEG", "MPO"):
        progressive, scans = jpeg_scans(data, count=complete)
        if progressive and not complete:  # more scans may follow: counted over the whole file
            return Verdict("whole")
        if scans > PLAIN_SCANS:  # a decode may run for minutes: decoded now, under the check's time limit
            return _verdict(data, max_pixels, True, dali, complete, pil_probe(data, max_pixels=max_pixels, decode=True))
    use_dali = dali is not None and dali.available
    if not use_dali:
        return _pil_only(pil)
    if pil.ok and (not decode or pil.fmt not in DALI_FORMATS):
        return _pil_only(pil)
    if not complete:
        return Verdict("more")
    if pil.ok:
        _, dali_reason = dali.decode(data, max_pixels=max_pixels)  # type: ignore[union-attr]
        if not dali_reason:
            return _pil_only(pil)
        return Verdict("convert", f"DALI's CPU decoder rejects this {pil.fmt} ({dali_reason}); PIL reads it: "
                                  "re-encoded as PNG")
    _, dali_reason = dali.decode(data, max_pixels=max_pixels, color="any")  # type: ignore[union-attr]
    if not dali_reason:
        return Verdict("convert", f"decoded by DALI only ({pil.reason}); re-encoded as PNG")
    reason = pil.reason if pil.kind == "data" or not dali_reason else f"{pil.reason}; {dali_reason}"
    return Verdict("bad", reason if pil.kind != "data" else f"cannot decode: {reason}; {dali_reason}")


_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_STANDALONE = frozenset({0x00, 0x01, *range(0xD0, 0xD9)})  # markers without a length (and escaped junk)


def jpeg_scans(data: bytes, *, count: bool = True) -> tuple[bool, int]:
    """(progressive, scans) of a JPEG's bytes (as far as they go): the frame's type, read from the marker
    segments before the first scan, and for a progressive frame the SOS markers from there on
    (entropy-coded bytes hold none: an ``FF`` there is followed by ``00`` or a restart marker). A
    sequential frame counts as 1: its scans code every block in 2 bits at least, so its decode time
    follows the file's size, where a progressive scan skips every block with one end-of-band run of a
    few bytes. Without ``count``, a progressive frame's first only (60 us a 64 kB less). (False, 0)
    when no scan is reached."""
    at, progressive, end = 2, False, len(data) - 4
    while at <= end:
        if data[at] != 0xFF:  # junk between segments, skipped as libjpeg and PIL skip it
            at = data.find(b"\xff", at)
            if at < 0:
                break
            continue
        marker = data[at + 1]
        if marker == 0xDA:
            return progressive, (1 + data.count(b"\xff\xda", at + 2)) if progressive and count else 1
        if marker == 0xFF or marker in _STANDALONE:  # a fill byte, or a marker without a length
            at += 1 if marker == 0xFF else 2
            continue
        progressive = progressive or marker in _PROGRESSIVE
        at += 2 + (data[at + 2] << 8 | data[at + 3])
    return progressive, 0


def _pil_only(pil: Probe) -> Verdict:
    if not pil.ok:
        return Verdict("bad", pil.reason if pil.kind != "data" else f"cannot decode: {pil.reason}")
    if pil.fmt not in DALI_FORMATS:
        return Verdict("convert", f"{pil.fmt} is not decodable by DALI; PIL reads it: re-encoded as PNG")
    return Verdict("ok")


@dataclass(frozen=True)
class Verdicts:
    """The verdicts of a batch of images, in order; ``noisy`` when a decoder printed an error line
    meanwhile (one image's verdict would carry it: the batch is asked again image by image)."""

    items: tuple[Verdict, ...]
    noisy: bool = False


@dataclass(frozen=True)
class Rescued:
    """An image DALI's CPU decoder rejects and PIL reads, re-encoded as PNG so that DALI decodes it."""

    png: bytes
    reason: str


def rescue_image(data: bytes, *, max_pixels: int, dali: DaliDecoder | None) -> Verdict | Rescued:
    """After DALI failed a batch: is ``data`` what broke it, and can it be delivered anyway?

    ``ok``: DALI's CPU decoder reads it (not the culprit; also when DALI is unavailable here,
    as nothing can then be blamed). :class:`Rescued`: DALI rejects it and PIL decodes it (the
    PNG of :func:`pil_png`). ``bad``: neither decodes it, with both reasons.
    """
    if dali is None or not dali.available:
        return Verdict("ok")
    _, dali_reason = dali.decode(data, max_pixels=max_pixels)
    if not dali_reason:
        return Verdict("ok")
    pil = pil_probe(data, max_pixels=max_pixels, decode=True)
    if not pil.ok:
        pixels, other = dali.decode(data, max_pixels=max_pixels, color="any")  # e.g. a lossless grey JPEG
        if pixels is None:
            return Verdict("bad", f"cannot decode: {pil.reason}; {dali_reason}")
        return Rescued(png_of(pixels), f"DALI's CPU decoder reads it only in its own colours ({dali_reason}; "
                                        f"{pil.reason}): delivered re-encoded as PNG")
    try:
        png = pil_png(data)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a verdict
        return Verdict("bad", f"cannot decode: PIL: {short(exc)}; {dali_reason}")
    return Rescued(png, f"DALI's CPU decoder rejects this {pil.fmt} ({dali_reason}); PIL reads it: "
                        "delivered re-encoded as PNG")


def convert_image(data: bytes, dali: DaliDecoder | None) -> bytes | str:
    """PNG bytes of ``data`` decoded by PIL, else by DALI; a reason string when neither can."""
    try:
        return pil_png(data)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a verdict
        pil_reason = f"PIL: {short(exc)}"
    if dali is None or not dali.available:
        return f"cannot re-encode: {pil_reason}"
    pixels, reason = dali.decode(data, color="any")
    if pixels is None:
        return f"cannot re-encode: {pil_reason}; {reason}"
    return png_of(pixels)


def png_of(pixels: Any) -> bytes:
    """PNG bytes of HWC uint8 pixels (1 channel: grey, 3: RGB)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


def dali_pixels(data: bytes, *, max_pixels: int | None, color: str, dali: DaliDecoder | None) -> tuple[Any, str]:
    """DALI's pixels of an image PIL rejects, in ``color`` (``rgb`` or ``gray``): (HWC uint8, "") or (None, reason).

    An image DALI reads only in its own colours (a lossless grey JPEG, refused as RGB) is converted from
    them by PIL, as stock Pillow decodes such a file and converts it.
    """
    if dali is None or not dali.available:
        return None, "DALI is not available"
    pixels, reason = dali.decode(data, max_pixels=max_pixels, color=color)
    if pixels is not None:
        return pixels, ""
    pixels, _ = dali.decode(data, max_pixels=max_pixels, color="any")
    if pixels is None:
        return None, reason
    import numpy as np
    from PIL import Image

    img = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels[:, :, :3])
    out = np.asarray(img.convert("L" if color == "gray" else "RGB"))
    return (out[:, :, None] if out.ndim == 2 else out), ""


def answer(job: tuple[Any, ...], dali: DaliDecoder | None) -> tuple[Any, ...]:
    """A check worker's answer to one job, as plain data (see :mod:`feedfast.checks.worker`):
    ``("verdict", status, reason)``, ``("verdicts", [(status, reason), ...])`` (a ``checks`` job's batch),
    ``("png", bytes)``, ``("rescued", png, reason)``, ``("pixels", array)`` (a ``decode`` job's) or
    ``("error", reason)``."""
    if job[0] == "rescue":
        r = rescue_image(job[1], max_pixels=job[2], dali=dali)
        return ("rescued", r.png, r.reason) if isinstance(r, Rescued) else ("verdict", r.status, r.reason)
    if job[0] == "check":
        complete = job[4] if len(job) > 4 else True
        v = check_image(job[1], max_pixels=job[2], decode=job[3], dali=dali, complete=complete)
        return ("verdict", v.status, v.reason)
    if job[0] == "checks":
        with pil_quiet():  # once for the batch (its cost is a tenth of a tiny JPEG's header check)
            found = [_verdict(data, job[2], job[3], dali, whole, _pil_probe(data, job[2], job[3]))
                     for data, whole in zip(job[1], job[4])]
        return ("verdicts", [(v.status, v.reason) for v in found])
    if job[0] == "png":
        out = convert_image(job[1], dali)
        return ("error", out) if isinstance(out, str) else ("png", out)
    if job[0] == "decode":
        pixels, reason = dali_pixels(job[1], max_pixels=job[2], color=job[3], dali=dali)
        return ("error", reason) if pixels is None else ("pixels", pixels)
    return ("error", f"unknown check job {job[0]!r}")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def with_decoder_output(answer: Any, output: str) -> Any:
    """An answer amended by what the decoders printed while producing it.

    A failure gets the decoders' own first error line (DALI's exception lacks it). An
    ``ok`` verdict with an ``[ERROR]`` line means DALI decoded the image only after one of
    its decoders failed (e.g. libtiff on a CMYK TIFF, then OpenCV): it becomes
    ``convert``, so the run itself decodes a plain PNG and prints nothing.
    """
    lines = [_ANSI.sub("", ln).strip() for ln in output.splitlines()]
    errors = [ln.replace("[ERROR] ", "") for ln in lines if "[ERROR]" in ln]
    said = (errors or [ln for ln in lines if "error" in ln.lower()] or [""])[0][:200]
    if not said:
        return answer
    if isinstance(answer, Verdicts):
        return Verdicts(answer.items, noisy=True)
    if isinstance(answer, str):
        return f"{answer} ({said})"
    if isinstance(answer, Verdict) and answer.status == "bad":
        return Verdict("bad", f"{answer.reason} ({said})")
    if isinstance(answer, Verdict) and answer.status == "convert":
        return Verdict("convert", f"{answer.reason} ({said})")
    if isinstance(answer, Rescued):
        return Rescued(answer.png, f"{answer.reason} ({said})")
    if isinstance(answer, Verdict) and answer.status == "ok" and errors:
        return Verdict("convert", f"DALI decodes it only after one of its decoders failed ({said}); "
                                  "re-encoded as PNG so that loading is quiet")
    return answer


HEADER = struct.Struct("<Q")


def write_message(f: IO[bytes], obj: Any) -> None:
    """Send one length-prefixed pickle (between feedfast and its own check workers only)."""
    blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(HEADER.pack(len(blob)) + blob)
    f.flush()


def read_message(f: IO[bytes]) -> Any:
    """Receive one message of :func:`write_message`; EOFError when the other side is gone."""
    head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise EOFError("the other side closed its pipe")
    size = HEADER.unpack(head)[0]
    blob = f.read(size)
    if len(blob) < size:
        raise EOFError("the other side closed its pipe")
    return pickle.loads(blob)  # noqa: S301 - feedfast's own process on the other end


def serve() -> None:
    """A check worker's loop: answer jobs from stdin on stdout until stdin closes.

    Run as ``python decoders.py`` (a file path, not ``-m``), so the worker imports PIL,
    NumPy and DALI but not feedfast's package (and with it torch): it starts in about the
    time DALI takes to import.
    """
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a decoder prints goes to the captured stream, never into the protocol
    dali = DaliDecoder()
    dali.warm()  # import and build now, outside any job's time limit
    write_message(out, "ready")
    inp = sys.stdin.buffer
    while True:
        try:
            job = read_message(inp)
        except EOFError:
            return
        write_message(out, answer(job, dali))


class DaliDecoder:
    """DALI's CPU image decoder over one image at a time, rebuilt after a failure.

    ``available`` is False when DALI cannot be imported or built here; callers then
    rely on PIL alone. With ``max_pixels``, the header is read first (``peek_image_shape``)
    and a larger image is refused before any pixel is decoded.
    """

    def __init__(self) -> None:
        self._pipes: dict[str, Any] = {}
        self.available = True
        try:
            import nvidia.dali  # noqa: F401
        except Exception:  # noqa: BLE001 - DALI absent or broken: PIL alone decides
            self.available = False

    def _build(self, what: str) -> Any:
        from nvidia.dali import fn, pipeline_def, types

        colors = {"rgb": types.RGB, "gray": types.GRAY, "any": types.ANY_DATA}

        @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
        def one_image() -> Any:
            raw = fn.external_source(name="raw", dtype=types.UINT8, ndim=1)
            if what == "peek":
                return fn.peek_image_shape(raw, dtype=types.INT64)
            return fn.decoders.image(raw, device="cpu", output_type=colors[what])

        pipe = one_image()
        pipe.build()
        return pipe

    def warm(self) -> None:
        """Import DALI and build the pipelines (on a 2x2 PNG), so the first real image is not slowed."""
        from PIL import Image

        if self.available:
            out = io.BytesIO()
            Image.new("RGB", (2, 2)).save(out, "PNG")
            self.decode(out.getvalue(), max_pixels=4)

    def _run(self, what: str, data: bytes) -> Any:
        import numpy as np

        if what not in self._pipes:
            self._pipes[what] = self._build(what)
        try:
            self._pipes[what].feed_input("raw", [np.frombuffer(data, dtype=np.uint8)])
            (out,) = self._pipes[what].run()
        except Exception:
            del self._pipes[what]  # a failed pipeline is not reused
            raise
        return np.array(out.as_array()[0])

    def decode(self, data: bytes, *, max_pixels: int | None = None, color: str = "rgb") -> tuple[Any, str]:
        """(HWC uint8 array, "") when DALI decodes ``data``, else (None, reason).

        ``color``: ``rgb`` (as the DALI backend decodes), ``gray``, or ``any`` (the file's own channels).
        """
        if not self.available:
            return None, "DALI is not available"
        try:
            if max_pixels is not None:
                h, w = (int(x) for x in self._run("peek", data)[:2])
                if h * w > max_pixels:
                    return None, f"DALI: image of {w}x{h} = {w * h} pixels exceeds max_pixels={max_pixels}"
            return self._run(color, data), ""
        except Exception as exc:  # noqa: BLE001 - any DALI failure is a verdict
            return None, f"DALI: {_dali_reason(exc)}"


def _dali_reason(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if "nvImageCodec" in ln or "ailed to decode" in ln]
    text = (useful[-1] if useful else lines[0] if lines else type(exc).__name__)
    return text.rstrip(" :")[:200]


if __name__ == "__main__":
    serve()
