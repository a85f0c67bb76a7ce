"""A shard holding every kind of bad (and tricky but good) sample, for reliability tests."""

from __future__ import annotations

import io
import random
import tarfile
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Mapping

import numpy as np
from PIL import Image

GOOD_KEYS = ["ok1", "cmyk", "gray", "png", "png16", "pnga", "gif", "ok2", "extra", "ok3"]
BAD_KEYS = {"trunc": "truncated", "garbage": "not an image", "zero": "zero-byte", "bomb": "exceeds max_pixels"}
MISSING_KEYS = ["nolabel"]


def _enc(img: Image.Image, fmt: str, **kw: object) -> bytes:
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def photo(seed: int, w: int = 50, h: int = 40) -> Image.Image:
    """A small RGB picture: gradients plus noise (JPEG artefacts and resize errors show on it)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype("uint8"))


def corpus_members() -> list[tuple[str, bytes]]:
    """(member name, bytes) in tar order; labels are the sample's position."""
    rgb = photo(0)
    good = _enc(rgb, "JPEG", quality=90)
    images = {
        "ok1": good, "cmyk": _enc(rgb.convert("CMYK"), "JPEG"), "gray": _enc(rgb.convert("L"), "JPEG"),
        "png": _enc(rgb, "PNG"), "png16": _enc(Image.fromarray(np.asarray(rgb.convert("L")).astype("uint16") * 257), "PNG"),
        "pnga": _enc(rgb.convert("RGBA"), "PNG"), "gif": _enc(rgb.convert("P"), "GIF"),
        "trunc": good[: len(good) // 2], "garbage": b"<html>404 not found</html>", "zero": b"",
        "bomb": _enc(Image.new("L", (3000, 3000)), "PNG"), "ok2": _enc(photo(1), "JPEG"),
    }
    members: list[tuple[str, bytes]] = []
    for i, (key, data) in enumerate(images.items()):
        members += [(f"{key}.jpg", data), (f"{key}.cls", str(i).encode())]
    members += [("nolabel.jpg", good)]  # a missing component
    members += [("extra.jpg", good), ("extra.cls", b"20"), ("extra.txt", b"an unknown component")]
    members += [("ok3.jpg", _enc(photo(2), "JPEG")), ("ok3.cls", b"21")]
    return members


def write_tar(path: Path, members: Iterable[tuple[str, bytes]]) -> Path:
    """A plain tar of (member name, bytes), in order (a name may repeat); its folder is made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_corpus(out: Path) -> Path:
    """Write the corpus shard and return its path."""
    return write_tar(out / "corpus-0000.tar", corpus_members())


def noisy_png(side: int, seed: int) -> bytes:
    """An uncompressed PNG of ``side`` x ``side`` random RGB pixels: slow to check, for time-limit tests."""
    rng = np.random.default_rng(seed)
    return _enc(Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)), "PNG", compress_level=0)


def mutate(data: bytes, kind: str, rng: random.Random) -> bytes:
    """A fuzzed copy of ``data``: ``truncate`` at a random byte, ``flip`` 8 random bytes, or ``zero`` 64 of them."""
    b = bytearray(data)
    at = rng.randrange(len(b))
    if kind == "truncate":
        return bytes(b[:at])
    if kind == "flip":
        for _ in range(8):
            b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
        return bytes(b)
    b[at:at + 64] = bytes(len(b[at:at + 64]))
    return bytes(b)


# --- hostile corpus: many formats, odd and broken, packed as a crawl packs them ---------------

def _png_with_bad_idat_crc(img: Image.Image) -> bytes:
    """A PNG whose IDAT checksum is wrong: PIL reads it (it does not check IDAT CRCs), libpng (DALI) refuses."""
    data = bytearray(_enc(img, "PNG"))
    at = data.index(b"IDAT")
    length = int.from_bytes(data[at - 4:at], "big")
    crc = at + 4 + length
    data[crc:crc + 4] = bytes(b ^ 0xFF for b in data[crc:crc + 4])
    return bytes(data)


def _psd(img: Image.Image) -> bytes:
    """A minimal RGB Photoshop file: header, empty sections, raw composite image data."""
    rgb = np.asarray(img.convert("RGB"))
    h, w, _ = rgb.shape
    head = b"8BPS" + (1).to_bytes(2, "big") + bytes(6) + (3).to_bytes(2, "big") + h.to_bytes(4, "big") + \
        w.to_bytes(4, "big") + (8).to_bytes(2, "big") + (3).to_bytes(2, "big")
    sections = bytes(4) + bytes(4) + bytes(4)  # colour mode data, image resources, layer and mask info
    planes = b"".join(rgb[:, :, c].tobytes() for c in range(3))
    return head + sections + (0).to_bytes(2, "big") + planes


def _dds_unimplemented() -> bytes:
    """A DDS header announcing DXGI format 93 (BC7-ish family PIL does not implement)."""
    header = bytearray(124)
    header[0:4] = (124).to_bytes(4, "little")
    header[4:8] = (0x1007).to_bytes(4, "little")
    header[8:12] = (16).to_bytes(4, "little")
    header[12:16] = (16).to_bytes(4, "little")
    pf = 72  # pixel format offset within the header
    header[pf:pf + 4] = (32).to_bytes(4, "little")
    header[pf + 4:pf + 8] = (0x4).to_bytes(4, "little")  # DDPF_FOURCC
    header[pf + 8:pf + 12] = b"DX10"
    dx10 = (93).to_bytes(4, "little") + (3).to_bytes(4, "little") + bytes(4) + (1).to_bytes(4, "little") + bytes(4)
    return b"DDS " + bytes(header) + dx10 + bytes(256)


def deflate_tiff(img: Image.Image) -> bytes:
    """A valid Deflate-compressed RGB TIFF, written by hand: DALI decodes it; a PIL built without
    libtiff cannot ("decoder libtiff not available"), one with libtiff can."""
    import struct
    import zlib

    rgb = np.asarray(img.convert("RGB"))
    h, w, _ = rgb.shape
    data = zlib.compress(rgb.tobytes())
    data_at = 8 + 6  # after the header and the three BitsPerSample values
    ifd_at = data_at + len(data) + (len(data) & 1)
    tags = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, 3, 8), (259, 3, 1, 8), (262, 3, 1, 2), (273, 4, 1, data_at),
            (277, 3, 1, 3), (278, 3, 1, h), (279, 4, 1, len(data)), (284, 3, 1, 1)]
    ifd = struct.pack("<H", len(tags))
    for tag, kind, count, value in tags:
        packed = struct.pack("<HH", value, 0) if kind == 3 and count == 1 else struct.pack("<I", value)
        ifd += struct.pack("<HHI", tag, kind, count) + packed
    return (b"II*\x00" + struct.pack("<I", ifd_at) + struct.pack("<HHH", 8, 8, 8) + data
            + b"\x00" * (len(data) & 1) + ifd + struct.pack("<I", 0))


def planar_extra_tiff(planes: np.ndarray, extra: int = 1, *, deflate: bool = True, signed: bool = False,
                      rows_per_strip: int | None = None) -> bytes:
    """A TIFF of separate planes (PlanarConfiguration 2) whose last ``extra`` planes are "unspecified" extra
    samples (ExtraSamples 0), written by hand from ``planes`` (H x W x N uint8): grey or RGB, then the extras.

    Pillow's test image ``separate_planar_extra_samples.tiff`` is one (grey, signed 8-bit samples, Deflate, one
    extra): Pillow 12.2 reads it without the extra planes; an older PIL (pillow-simd 12.1) refuses it, and
    DALI's libtiff decoder refuses signed samples."""
    import struct
    import zlib

    h, w, n = planes.shape
    rows = rows_per_strip or h
    strips = [np.ascontiguousarray(planes[y:y + rows, :, c]).tobytes() for c in range(n) for y in range(0, h, rows)]
    strips = [zlib.compress(b) for b in strips] if deflate else strips
    out = bytearray(b"II*\x00" + bytes(4))

    def put(data: bytes) -> int:
        at = len(out)
        out.extend(data + b"\x00" * (len(data) & 1))
        return at

    offsets = [put(b) for b in strips]
    tags = [(256, 3, [w]), (257, 3, [h]), (258, 3, [8] * n), (259, 3, [8 if deflate else 1]),
            (262, 3, [1 if n - extra == 1 else 2]), (273, 4, offsets), (277, 3, [n]), (278, 3, [rows]),
            (279, 4, [len(b) for b in strips]), (284, 3, [2]), (338, 3, [0] * extra), (339, 3, [2 if signed else 1] * n)]
    entries = b""
    for tag, kind, values in tags:
        packed = struct.pack(f"<{len(values)}{'H' if kind == 3 else 'I'}", *values)
        value = packed.ljust(4, b"\x00") if len(packed) <= 4 else struct.pack("<I", put(packed))
        entries += struct.pack("<HHI", tag, kind, len(values)) + value
    out[4:8] = struct.pack("<I", len(out))
    out.extend(struct.pack("<H", len(tags)) + entries + bytes(4))
    return bytes(out)


def _animated_gif(seed: int) -> bytes:
    frames = [photo(seed + i).convert("P") for i in range(3)]
    b = io.BytesIO()
    frames[0].save(b, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return b.getvalue()


def _multipage_tiff(seed: int) -> bytes:
    frames = [photo(seed + i) for i in range(2)]
    b = io.BytesIO()
    frames[0].save(b, "TIFF", save_all=True, append_images=frames[1:])
    return b.getvalue()


def _mpo(img: Image.Image) -> bytes:
    """A two-frame MPO (a stereo JPEG pair): DALI and PIL read the first frame."""
    b = io.BytesIO()
    img.save(b, "MPO", save_all=True, append_images=[img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)])
    return b.getvalue()


def _junk_between_segments(jpeg: bytes) -> bytes:
    """A JPEG with 3 stray bytes before its quantization table: libjpeg (PIL) warns and reads it,
    DALI's parser stops ("Invalid marker") and fails the batch."""
    at = jpeg.index(b"\xff\xdb")
    return jpeg[:at] + b"\x12\x34\x56" + jpeg[at:]


def _gradient16() -> Image.Image:
    """A 16-bit grey gradient whose mean is 0.5 of full scale."""
    ramp = np.linspace(0, 65535, 64).round().astype("uint16")
    return Image.fromarray(np.tile(ramp, (48, 1)))



def _with_extra(img: Image.Image) -> np.ndarray:
    """``img``'s bands (H x W x C) and one more plane of noise after them."""
    bands = np.asarray(img).reshape(img.height, img.width, -1)
    noise = np.random.default_rng(9).integers(0, 256, bands.shape[:2] + (1,), dtype=np.uint8)
    return np.concatenate([bands, noise], axis=2)

@lru_cache(maxsize=1)
def hostile_images() -> Mapping[str, tuple[bytes, str]]:
    """{key: (bytes, expected)}: expected is ``delivered`` or ``skipped`` (under either on_error policy,
    on every backend). Made once per process (read-only).

    Every file is stored as ``<key>.jpg`` whatever its format, as a crawl stores it.
    """
    rgb = photo(7, 64, 48)
    jpeg = _enc(rgb, "JPEG", quality=90)
    delivered = {
        "jpeg": jpeg, "jpeg_cmyk": _enc(rgb.convert("CMYK"), "JPEG"), "jpeg_gray": _enc(rgb.convert("L"), "JPEG"),
        "jpeg_progressive": _enc(rgb, "JPEG", progressive=True),
        "jpeg_bad_exif": jpeg[:2] + b"\xff\xe1\x00\x10Exif\x00\x00MM\x00*\x00\x00\x00\xff" + jpeg[2:],
        "jpeg_bad_icc": _enc(rgb, "JPEG", icc_profile=b"not an ICC profile" * 10), "mpo": _mpo(rgb),
        "png16": _enc(_gradient16(), "PNG"), "png_palette": _enc(rgb.convert("P"), "PNG"),
        "png_la": _enc(rgb.convert("LA"), "PNG"), "png_rgba": _enc(rgb.convert("RGBA"), "PNG"),
        "png_bad_crc": _png_with_bad_idat_crc(rgb), "jpeg_junk_segment": _junk_between_segments(jpeg),
        "gif": _enc(rgb.convert("P"), "GIF"), "gif_animated": _animated_gif(3),
        "tiff": _enc(rgb, "TIFF"), "tiff_cmyk": _enc(rgb.convert("CMYK"), "TIFF"), "tiff_deflate": deflate_tiff(rgb),
        "tiff_pages": _multipage_tiff(5), "bmp": _enc(rgb, "BMP"),
        "tiff_planar_extra": planar_extra_tiff(_with_extra(rgb.convert("L")), signed=True),  # as Pillow's test image
        "tiff_planar_rgbx": planar_extra_tiff(_with_extra(rgb), deflate=False, rows_per_strip=16),
        "ppm": _enc(rgb, "PPM"), "pgm": _enc(rgb.convert("L"), "PPM"), "tga": _enc(rgb, "TGA"),
        "sgi": _enc(rgb, "SGI"), "pcx": _enc(rgb, "PCX"), "ico": _enc(rgb, "ICO", sizes=[(32, 32)]),
        "dds": _enc(rgb.convert("RGBA"), "DDS"), "qoi": _enc(rgb, "QOI"), "im": _enc(rgb, "IM"),
        "psd": _psd(rgb),
    }
    skipped = {
        "zero": b"", "garbage": b"<html>404 not found</html>" * 3,
        "jpeg_truncated": jpeg[: len(jpeg) // 2], "png_truncated": _enc(rgb, "PNG")[:300],
        "gif_truncated": _animated_gif(3)[:400], "tga_truncated": _enc(rgb, "TGA")[:2000],
        "sgi_truncated": _enc(rgb, "SGI")[:2000], "dds_dxgi93": _dds_unimplemented(),
        "junk_before_soi": b"\x00\x00" + jpeg, "bomb": _enc(Image.new("L", (3000, 3000)), "PNG"),
        "bomb_tiff_deflate": deflate_tiff(Image.new("RGB", (3000, 3000))),  # PIL without libtiff: DALI's header says
    }
    return MappingProxyType({**{k: (v, "delivered") for k, v in delivered.items()},
                             **{k: (v, "skipped") for k, v in skipped.items()}})


def write_hostile(out: Path, keys: list[str] | None = None, name: str = "hostile-0000.tar") -> Path:
    """A shard of ``<key>.jpg`` + ``<key>.cls`` samples from :func:`hostile_images` (all, or ``keys``)."""
    images = hostile_images()
    return write_tar(out / name, [m for i, key in enumerate(keys or list(images))
                                  for m in ((f"{key}.jpg", images[key][0]), (f"{key}.cls", str(i).encode()))])
