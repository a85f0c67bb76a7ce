"""feedfast's C extension: JPEG region decoding equals Pillow's decode where it reaches; normalize equals NumPy's."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from feedfast.loader.backends.cpu import native, pil_fast
from feedfast.write.synth import make_image

pytestmark = pytest.mark.skipif(not native.built(), reason="feedfast._native is not built here")


def _jpeg(width: int = 301, height: int = 203, **save: Any) -> bytes:
    buf = io.BytesIO()
    img = make_image(np.random.default_rng(width * height), width, height)
    if save.pop("gray", False):
        img = img.convert("L")
    if save.pop("cmyk", False):
        img = img.convert("CMYK")
    img.save(buf, format="JPEG", **{"quality": 90, **save})
    return buf.getvalue()


def _full(raw: bytes, denom: int = 1) -> np.ndarray:
    img = Image.open(io.BytesIO(raw))
    if denom > 1:
        img.draft(img.mode, (img.width // denom, img.height // denom))
    img.load()
    return np.asarray(img)


def _region(raw: bytes, denom: int, box: tuple[int, int, int, int]) -> tuple[np.ndarray, int, int]:
    found = pil_fast.decode_region(Image.open(io.BytesIO(raw)), raw, denom, box)
    assert found is not None
    img, x0, y0 = found
    arr = np.asarray(img)
    return (arr[:, :, :3] if img.mode == "RGBX" else arr), x0, y0


def test_the_extension_is_built_by_the_install() -> None:
    """`make setup` and CI install libjpeg-turbo's headers: the extension must have built (else the skip above)."""
    assert native.libjpeg_turbo_version() is not None


@pytest.mark.parametrize("save", [{"subsampling": 2}, {"subsampling": 1}, {"subsampling": 0}, {"gray": True},
                                  {"progressive": True}, {"subsampling": 2, "quality": 60, "optimize": True}],
                         ids=["420", "422", "444", "gray", "progressive", "optimized"])
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_a_region_equals_pillows_decode_wherever_the_box_reaches(save: dict[str, Any], denom: int) -> None:
    raw = _jpeg(**save)
    full = _full(raw, denom)
    h, w = full.shape[:2]
    for box in [(0, 0, w, h), (w // 3, h // 4, w // 3 + w // 5, h // 4 + h // 3), (1, 1, 5, 5), (w - 9, h - 7, w, h),
                (0, h // 2, w // 2, h)]:
        pixels, x0, y0 = _region(raw, denom, box)
        left, top, right, bottom = box
        assert (x0, y0, pixels.shape[1], pixels.shape[0]) == (left, top, right - left, bottom - top)
        assert np.array_equal(pixels, full[top:bottom, left:right]), box  # the edges too: decoded with a margin


def test_what_the_region_decoder_does_not_take_is_left_to_pillow() -> None:
    cmyk = _jpeg(cmyk=True)
    assert pil_fast.decode_region(Image.open(io.BytesIO(cmyk)), cmyk, 1, (0, 0, 10, 10)) is None
    buf = io.BytesIO()
    make_image(np.random.default_rng(1), 64, 48).save(buf, format="PNG")
    png = buf.getvalue()
    assert pil_fast.decode_region(Image.open(io.BytesIO(png)), png, 1, (0, 0, 10, 10)) is None


def test_corrupt_data_inside_the_region_is_refused_and_below_it_is_never_read() -> None:
    raw = _jpeg(640, 480)
    img = Image.open(io.BytesIO(raw))
    cut = raw[: len(raw) // 3]  # the data ends about a third of the way down
    assert pil_fast.decode_region(img, cut, 1, (0, 300, 640, 480)) is None  # a premature end: libjpeg's warning
    pixels, _, _ = _region(cut, 1, (100, 10, 200, 60))  # rows above the cut: delivered, as load_rows does
    assert np.array_equal(pixels, _full(raw)[10:60, 100:200])
    with pytest.raises(ValueError, match="denom"):
        native.ext.decode_region(raw, 3, 0, 0, 1, 1, False)
    with pytest.raises(ValueError):
        native.ext.decode_region(b"not a jpeg", 1, 0, 0, 1, 1, False)


def _numpy_normalize(pixels: np.ndarray, mean: np.ndarray, inv: np.ndarray, chw: bool) -> np.ndarray:
    if chw:
        out = np.empty((pixels.shape[2], *pixels.shape[:2]), np.float32)
        np.copyto(out, pixels.transpose(2, 0, 1), casting="unsafe")
        np.subtract(out, mean[:, None, None], out=out)
        np.multiply(out, inv[:, None, None], out=out)
        return out
    out = pixels.astype(np.float32)
    np.subtract(out, mean, out=out)
    np.multiply(out, inv, out=out)
    return out


@pytest.mark.parametrize("view", ["plain", "hflip", "vflip", "rgbx", "gray", "rgb-hflip", "wide-hflip"])
@pytest.mark.parametrize("chw", [True, False])
def test_normalize_into_equals_numpys_float32_arithmetic_bit_for_bit(view: str, chw: bool) -> None:
    rng = np.random.default_rng(5)
    base = rng.integers(0, 256, (37, 53, 4), dtype=np.uint8)
    wide = rng.integers(0, 256, (3, 2101, 4), dtype=np.uint8)  # wider than the flip path's row buffer
    rgb = np.ascontiguousarray(base[:, :, :3])
    pixels = {"plain": rgb, "hflip": base[:, ::-1, :3], "vflip": base[::-1, :, :3], "rgbx": base[:, :, :3],
              "gray": base[:, :, :1], "rgb-hflip": rgb[:, ::-1], "wide-hflip": wide[:, ::-1, :3]}[view]
    channels = pixels.shape[2]
    mean = np.array([0.485 * 255, 0.456 * 255, 0.406 * 255][:channels], np.float32)
    inv = np.array([1 / (0.229 * 255), 1 / (0.224 * 255), 1 / (0.225 * 255)][:channels], np.float32)
    expected = _numpy_normalize(pixels, mean, inv, chw)
    out = np.full(expected.shape, np.nan, np.float32)
    assert native.normalize_into(pixels, out, mean, inv, chw)
    assert np.array_equal(out, expected)


def test_normalize_into_refuses_what_it_cannot_write() -> None:
    pixels = np.zeros((4, 4, 3), np.uint8)
    mean = inv = np.zeros(3, np.float32)
    assert not native.normalize_into(pixels, np.empty((3, 4, 4), np.float16), mean, inv, True)  # NumPy does it
    with pytest.raises(ValueError, match="element count"):
        native.ext.normalize_into(pixels, np.empty((3, 4, 3), np.float32), mean, inv, True)
    with pytest.raises(ValueError, match="one per channel"):
        native.ext.normalize_into(pixels, np.empty((3, 4, 4), np.float32), mean[:2], inv[:2], True)


def test_damaged_files_and_any_box_give_pixels_or_value_error_never_a_crash() -> None:
    """Flipped bytes, cuts, inserted junk, odd sizes, colour spaces, boxes outside the image: seeded, 2,000 cases."""
    import random

    rng, pick = np.random.default_rng(0), random.Random(0)
    bases = [_jpeg(w, h, **kw) for w, h, kw in [(1, 1, {}), (1, 37, {}), (37, 1, {}), (17, 9, {"progressive": True}),
                                                 (123, 77, {"subsampling": 1}), (64, 64, {"subsampling": 0}),
                                                 (60, 40, {"gray": True}), (60, 40, {"cmyk": True})]]
    del rng
    decoded = 0
    for _ in range(2000):
        raw = bytearray(pick.choice(bases))
        kind = pick.random()
        if kind < 0.3:
            for _ in range(pick.randint(1, 8)):
                raw[pick.randrange(len(raw))] = pick.randrange(256)
        elif kind < 0.5:
            raw = raw[: pick.randrange(len(raw))]
        elif kind < 0.6:
            at = pick.randrange(len(raw))
            raw[at:at] = bytes(pick.randrange(256) for _ in range(pick.randint(1, 50)))
        box = [pick.choice([0, 1, 2, pick.randrange(400), 10**9, 2**32 - 1]) for _ in range(4)]
        gray = pick.random() < 0.3
        try:
            pixels, _, _, width, height = native.ext.decode_region(bytes(raw), pick.choice([1, 2, 4, 8]), *box, gray)
        except ValueError:
            continue
        assert len(pixels) == width * (1 if gray else 4) * (height + 1) and width >= 1 and height >= 1
        decoded += 1
    assert 500 < decoded < 2000


@pytest.mark.parametrize("save", [{}, {"progressive": True}, {"gray": True}, {"subsampling": 0}])
def test_the_header_read_in_c_gives_pillows_size_and_mode(save: dict[str, Any]) -> None:
    raw = _jpeg(211, 97, **save)
    header = pil_fast.jpeg_header(raw)
    img = Image.open(io.BytesIO(raw))
    assert header is not None and (header.size, header.mode) == (img.size, img.mode)


def test_what_the_header_reader_does_not_take_is_left_to_pillow() -> None:
    buf = io.BytesIO()
    make_image(np.random.default_rng(1), 64, 48).save(buf, format="PNG")
    raw = _jpeg(40, 30)
    assert pil_fast.jpeg_header(_jpeg(cmyk=True)) is None
    assert pil_fast.jpeg_header(buf.getvalue()) is None
    assert pil_fast.jpeg_header(raw[:40]) is None  # cut inside the header
    assert pil_fast.jpeg_header(b"") is None


def test_the_header_reader_keeps_pillows_decompression_bomb_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _jpeg(100, 100)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 6000)
    with pytest.warns(Image.DecompressionBombWarning):
        assert pil_fast.jpeg_header(raw) is not None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 4000)
    with pytest.raises(Image.DecompressionBombError):
        pil_fast.jpeg_header(raw)
