"""JPEGs made byte by byte for the decode-rule tests: files one decoder reads and the other refuses,
a lossless (SOF3) JPEG, and a progressive JPEG of many empty scans (a decode-time bomb)."""

from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image

from tests.corpus import photo


def jpeg(seed: int, w: int = 64, h: int = 48, *, progressive: bool = False, quality: int = 90) -> bytes:
    """A small photo-like baseline (or progressive) JPEG."""
    out = io.BytesIO()
    photo(seed, w, h).save(out, "JPEG", quality=quality, progressive=progressive)
    return out.getvalue()


def stray_marker(data: bytes, at: float) -> bytes:
    """``data`` with ``FF 2F`` (a marker code no JPEG defines) written at fraction ``at`` of its length, in
    the entropy-coded data of a baseline JPEG's second half: pillow-simd's libjpeg-turbo 2.1 stops there
    ("broken data stream"), DALI's decoder reads past it (the rows decoded before it, then zeros)."""
    b = bytearray(data)
    i = int(len(b) * at)
    b[i], b[i + 1] = 0xFF, 0x2F
    return bytes(b)


def pillow_rejects_dali_decodes(count: int) -> list[bytes]:
    """``count`` fuzzed baseline JPEGs of the kind PIL rejects and DALI decodes (a stray marker late in
    the data), each a different image and position; the tests check that each is of that kind."""
    return [stray_marker(jpeg(seed, 64, 48), 0.55 + 0.3 * (seed % 7) / 7) for seed in range(count)]


def _segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">HH", marker, len(payload) + 2) + payload


class _Bits:
    """An entropy-coded segment written MSB first, ``FF`` bytes stuffed with ``00``, padded with ones."""

    def __init__(self) -> None:
        self.acc, self.count, self.out = 0, 0, bytearray()

    def put(self, value: int, n: int) -> None:
        self.acc = (self.acc << n) | (value & ((1 << n) - 1))
        self.count += n
        while self.count >= 8:
            self.count -= 8
            byte = (self.acc >> self.count) & 0xFF
            self.out += b"\xff\x00" if byte == 0xFF else bytes([byte])
        self.acc &= (1 << self.count) - 1

    def bytes(self) -> bytes:
        if self.count:
            self.put((1 << (8 - self.count)) - 1, 8 - self.count)
        return bytes(self.out)


def lossless_jpeg(pixels: np.ndarray) -> bytes:
    """A lossless (SOF3) 8-bit grey JPEG of ``pixels`` (H x W uint8), predictor 1 (the left neighbour).

    libjpeg-turbo 2.1 (pillow-simd's) cannot decode this process; DALI decodes it exactly, as grey.
    """
    h, w = pixels.shape
    bits = bytes([0, 0, 0, 0, 17] + [0] * 11)  # categories 0..16, each a 5-bit code
    dht = _segment(0xFFC4, b"\x00" + bits + bytes(range(17)))
    sof = _segment(0xFFC3, struct.pack(">BHHB", 8, h, w, 1) + bytes([1, 0x11, 0]))
    sos = _segment(0xFFDA, bytes([1, 1, 0x00, 1, 0, 0]))
    out = _Bits()
    p = pixels.astype(np.int64)
    for y in range(h):
        for x in range(w):
            pred = 128 if x == y == 0 else p[y - 1, x] if x == 0 else p[y, x - 1]
            diff = int(p[y, x] - pred)
            size = abs(diff).bit_length()
            out.put(size, 5)
            if size:
                out.put(diff if diff > 0 else diff + (1 << size) - 1, size)
    return b"\xff\xd8" + dht + sof + sos + out.bytes() + b"\xff\xd9"


def scan_bomb(side: int, scans: int) -> bytes:
    """A valid progressive grey JPEG of ``side`` x ``side`` pixels: one DC scan of zeros, then ``scans``
    AC scans that each code every block as one long end-of-band run (a few bytes a scan). Each scan
    still walks every block, so decoding costs ``scans`` times the image's blocks: 5,000 scans over
    67 MP take a minute from 741 KB."""
    blocks = (-(-side // 8)) ** 2
    dqt = _segment(0xFFDB, b"\x00" + bytes([1] * 64))
    sof = _segment(0xFFC2, struct.pack(">BHHB", 8, side, side, 1) + bytes([1, 0x11, 0]))
    one_code = bytes([1] + [0] * 15)  # one symbol, coded by the single bit 0
    dht = _segment(0xFFC4, b"\x00" + one_code + b"\x00") + _segment(0xFFC4, b"\x10" + one_code + b"\xe0")
    dc = _Bits()
    for _ in range(blocks):
        dc.put(0, 1)  # DC difference of category 0
    parts = [b"\xff\xd8", dqt, sof, dht, _segment(0xFFDA, bytes([1, 1, 0x00, 0, 0, 0])), dc.bytes()]
    ac = _Bits()
    left = blocks
    while left > 0:  # EOB14: a run of 2**14 + the next 14 bits blocks
        run = min(left, (1 << 15) - 1)
        if run < 1 << 14:
            ac.put(0, 1)
            ac.put(0, 14)  # a shorter tail: EOB14 of 2**14 still ends the scan (the run outlasts the blocks)
            left = 0
            break
        ac.put(0, 1)
        ac.put(run - (1 << 14), 14)
        left -= run
    ac_scan = _segment(0xFFDA, bytes([1, 1, 0x00, 1, 63, 0])) + ac.bytes()
    return b"".join(parts) + ac_scan * scans + b"\xff\xd9"


def decodes_with_pil(data: bytes) -> bool:
    """Whether this PIL decodes ``data`` to pixels."""
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception:  # noqa: BLE001 - any failure is "no"
        return False
    return True


def junk_between_segments(data: bytes) -> bytes:
    """A JPEG with 3 stray bytes before its quantization table: libjpeg (PIL) skips them, DALI's parser
    stops ("Invalid marker")."""
    at = data.index(b"\xff\xdb")
    return data[:at] + b"\x12\x34\x56" + data[at:]


def fuzz_members(*, broken: bool, lossless: bool = True) -> list[tuple[str, bytes]]:
    """(member name, bytes) of a shard for the backends' agreement: good JPEGs, JPEGs only DALI decodes
    (``dali-*``: stray markers; with ``lossless``, ``lossless``: a grey SOF3 JPEG, which DALI decodes as
    grey only), JPEGs only PIL decodes (``pil-*``), and with ``broken`` truncated ones neither decodes
    (``cut-*``); all 64 x 48, labels by position."""
    images = [(f"good-{s}", jpeg(s)) for s in range(3)]
    images += [(f"dali-{s}", data) for s, data in enumerate(pillow_rejects_dali_decodes(8))]
    images += [("lossless", lossless_jpeg(np.asarray(photo(9, 64, 48).convert("L"))))] if lossless else []
    images += [(f"pil-{s}", junk_between_segments(jpeg(10 + s))) for s in range(2)]
    if broken:
        images += [(f"cut-{s}", jpeg(20 + s)[: 400 + 300 * s]) for s in range(2)]
    members = []
    for n, (key, data) in enumerate(images):
        members += [(f"{key}.jpg", data), (f"{key}.cls", str(n).encode())]
    return members
