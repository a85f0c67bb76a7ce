"""A shard holding every kind of bad (and tricky but good) sample, for reliability tests."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

GOOD_KEYS = ["ok1", "cmyk", "gray", "png", "png16", "pnga", "gif", "ok2", "extra", "ok3"]
BAD_KEYS = {"trunc": "truncated", "garbage": "not an image", "zero": "zero-byte", "bomb": "exceeds max_pixels"}
MISSING_KEYS = ["nolabel"]


def _enc(img: Image.Image, fmt: str, **kw: object) -> bytes:
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def _photo(seed: int, w: int = 50, h: int = 40) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype("uint8"))


def corpus_members() -> list[tuple[str, bytes]]:
    """(member name, bytes) in tar order; labels are the sample's position."""
    rgb = _photo(0)
    good = _enc(rgb, "JPEG", quality=90)
    images = {
        "ok1": good, "cmyk": _enc(rgb.convert("CMYK"), "JPEG"), "gray": _enc(rgb.convert("L"), "JPEG"),
        "png": _enc(rgb, "PNG"), "png16": _enc(Image.fromarray(np.asarray(rgb.convert("L")).astype("uint16") * 257), "PNG"),
        "pnga": _enc(rgb.convert("RGBA"), "PNG"), "gif": _enc(rgb.convert("P"), "GIF"),
        "trunc": good[: len(good) // 2], "garbage": b"<html>404 not found</html>", "zero": b"",
        "bomb": _enc(Image.new("L", (3000, 3000)), "PNG"), "ok2": _enc(_photo(1), "JPEG"),
    }
    members: list[tuple[str, bytes]] = []
    for i, (key, data) in enumerate(images.items()):
        members += [(f"{key}.jpg", data), (f"{key}.cls", str(i).encode())]
    members += [("nolabel.jpg", good)]  # a missing component
    members += [("extra.jpg", good), ("extra.cls", b"20"), ("extra.txt", b"an unknown component")]
    members += [("ok3.jpg", _enc(_photo(2), "JPEG")), ("ok3.cls", b"21")]
    return members


def write_corpus(out: Path) -> Path:
    """Write the corpus shard and return its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "corpus-0000.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in corpus_members():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
