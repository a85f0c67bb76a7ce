"""feedfast's resize (``feedfast/_resample.c``): Pillow's ``Image.resize`` bit for bit, then flips and normalize."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from feedfast.loader.backends.cpu import native, pil_fast
from feedfast.write.synth import make_image

pytestmark = pytest.mark.skipif(not native.built(), reason="feedfast._native is not built here")

FILTERS = [Image.Resampling.NEAREST, Image.Resampling.BOX, Image.Resampling.BILINEAR, Image.Resampling.HAMMING,
           Image.Resampling.BICUBIC, Image.Resampling.LANCZOS]
EXT: Any = native.ext  # the extension's functions are untyped
MEAN = np.array([0.485 * 255, 0.456 * 255, 0.406 * 255], np.float32)
INV = np.array([1 / (0.229 * 255), 1 / (0.224 * 255), 1 / (0.225 * 255)], np.float32)


@pytest.fixture(scope="module")
def flavour() -> int:
    found = native.resample_flavour()
    if found is None:
        import PIL

        pytest.skip(f"Pillow {PIL.__version__}'s resize is not one the extension reproduces")
    return found


def _stored(img: Image.Image) -> tuple[bytes, int]:
    """The image's pixels as Pillow stores them (RGB as 4 bytes a pixel) and the bytes a pixel."""
    return (img.convert("RGBX").tobytes(), 4) if img.mode == "RGB" else (img.tobytes(), 1)


def _ours(img: Image.Image, size: tuple[int, int], resample: int, box: tuple[float, float, float, float],
          gap: float | None, flavour: int, hflip: bool = False, vflip: bool = False) -> np.ndarray:
    pixels, pixel = _stored(img)
    out = np.empty((size[1], size[0], 3 if pixel == 4 else 1), np.uint8)
    EXT.resample_into(pixels, img.width, img.height, pixel, img.width * pixel, box, resample, gap or 0.0, hflip,
                             vflip, out, None, None, False, flavour)
    return out


def _pillows(img: Image.Image, size: tuple[int, int], resample: int, box: tuple[float, float, float, float],
             gap: float | None) -> np.ndarray:
    arr = np.asarray(img.resize(size, resample, box=box, reducing_gap=gap))
    return arr[:, :, None] if arr.ndim == 2 else arr


@st.composite
def _cases(draw: Any) -> tuple[Image.Image, tuple[int, int], int, tuple[float, float, float, float], float | None]:
    width, height = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    mode = draw(st.sampled_from(["L", "RGB"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode)
    if draw(st.booleans()):
        box = (0.0, 0.0, float(width), float(height))
    else:
        x0, x1 = sorted(draw(st.floats(0, width, allow_nan=False)) for _ in range(2))
        y0, y1 = sorted(draw(st.floats(0, height, allow_nan=False)) for _ in range(2))
        box = (x0, y0, x1, y1)
    size = (draw(st.integers(1, 60)), draw(st.integers(1, 60)))  # up and down
    return img, size, draw(st.sampled_from(FILTERS)), box, draw(st.sampled_from([None, 3.0, 2.0, 1.0]))


@settings(max_examples=600, deadline=None, derandomize=True)
@given(case=_cases())
def test_resample_into_equals_pillows_resize_bit_for_bit(case: Any, flavour: int) -> None:
    img, size, resample, box, gap = case
    try:
        expected = _pillows(img, size, resample, box, gap)
    except ValueError:  # Pillow refuses (an empty box for a reduction): so do we
        with pytest.raises(ValueError):
            _ours(img, size, resample, box, gap, flavour)
        return
    assert np.array_equal(_ours(img, size, resample, box, gap, flavour), expected)


@pytest.mark.parametrize("resample", FILTERS)
@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_photos_down_and_up_with_and_without_reducing_gap(resample: int, mode: str, flavour: int) -> None:
    """A photo-like image at the threaded path's shapes: a random crop of 300 x 400 to 224, odd sizes, 1 pixel."""
    img = make_image(np.random.default_rng(3), 401, 303).convert(mode)
    cases = [((224, 224), (13.7, 2.25, 313.9, 302.5)), ((224, 224), (0.0, 0.0, 401.0, 303.0)),
             ((37, 23), (100.5, 50.25, 391.0, 288.75)), ((500, 333), (10.0, 20.0, 200.5, 130.5)),
             ((1, 1), (0.0, 0.0, 401.0, 303.0)), ((401, 1), (0.0, 150.5, 401.0, 151.0)),
             ((7, 303), (3.0, 0.0, 10.0, 303.0)), ((50, 50), (5.0, 5.0, 55.0, 55.0))]  # the last: a crop
    for size, box in cases:
        for gap in (None, 3.0, 2.0):
            assert np.array_equal(_ours(img, size, resample, box, gap, flavour),
                                  _pillows(img, size, resample, box, gap)), (size, box, gap)
    one = Image.fromarray(np.array([[[9, 200, 77]]], np.uint8)).convert(mode)
    for size in ((1, 1), (5, 3)):
        assert np.array_equal(_ours(one, size, resample, (0.0, 0.0, 1.0, 1.0), 3.0, flavour),
                              _pillows(one, size, resample, (0.0, 0.0, 1.0, 1.0), 3.0))


ISAS = {2: "avx2", 1: "sse4", 0: "c"}


@pytest.fixture(params=sorted(ISAS, reverse=True), ids=lambda level: ISAS[level])
def isa(request: pytest.FixtureRequest) -> Any:
    """Each instruction set the CPU has (the extension's resample_isa cap), the best one again afterwards."""
    level = request.param
    try:
        if EXT.resample_isa(level) != level:
            pytest.skip(f"this CPU has no {ISAS[level]}")
        yield level
    finally:
        EXT.resample_isa(2)


def _edge_cases() -> list[tuple[tuple[int, int], str, tuple[int, int], int, tuple[float, float, float, float] | None,
                                 float | None]]:
    """(image size, mode, out size, filter, box or None for the whole image, gap): the SIMD passes' edges."""
    cases: list[Any] = []
    for mode in ("RGB", "L"):
        for resample in FILTERS[1:]:
            cases += [((1, 1), mode, (97, 53), resample, None, None),  # one pixel, up
                      ((7, 5), mode, (401, 299), resample, None, None),  # big upscale: many rows a tap
                      ((300, 5), mode, (13, 3), resample, None, 3.0),  # rows not a multiple of 4
                      ((17, 3), mode, (9, 7), resample, None, None),  # widths not a multiple of 8 or 4
                      ((333, 257), mode, (111, 86), resample, (0.5, 1.25, 332.0, 256.5), None),
                      ((640, 480), mode, (37, 53), resample, None, 3.0),  # a reduction, then the rest
                      ((640, 480), mode, (211, 160), resample, None, 1.0),  # 1x3 (pillow-simd's own rounding)
                      ((97, 83), mode, (10, 9), resample, (3.5, 1.0, 96.0, 80.0), 1.0),  # 9x9, edge blocks cut
                      ((3, 800), mode, (1, 2), resample, None, 1.0)]  # blocks of 400 rows (32-bit sums)
    return cases


@pytest.mark.parametrize("case", _edge_cases(), ids=str)
def test_every_instruction_set_gives_pillows_pixels_at_the_edges(case: Any, isa: int, flavour: int) -> None:
    (width, height), mode, size, resample, box, gap = case
    rng = np.random.default_rng(width * 1000 + height + resample)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode)
    box = box or (0.0, 0.0, float(width), float(height))
    assert np.array_equal(_ours(img, size, resample, box, gap, flavour), _pillows(img, size, resample, box, gap))


def test_every_instruction_set_gives_pillows_pixels_on_random_cases(isa: int, flavour: int) -> None:
    """Larger random images, boxes and sizes than the property test's (up to 400 pixels a side, up and down)."""
    rng = np.random.default_rng(11)
    for _ in range(60):
        width, height = (int(v) for v in rng.integers(1, 400, 2))
        mode = ["L", "RGB"][int(rng.integers(2))]
        img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode)
        x0, x1 = sorted(float(v) for v in rng.uniform(0, width, 2))
        y0, y1 = sorted(float(v) for v in rng.uniform(0, height, 2))
        box = (0.0, 0.0, float(width), float(height)) if rng.integers(2) else (x0, y0, x1, y1)
        size = (int(rng.integers(1, 400)), int(rng.integers(1, 400)))
        resample = FILTERS[int(rng.integers(1, len(FILTERS)))]
        gap = [None, 3.0, 2.0, 1.0][int(rng.integers(4))]
        try:
            expected = _pillows(img, size, resample, box, gap)
        except ValueError:
            continue
        assert np.array_equal(_ours(img, size, resample, box, gap, flavour), expected), (img.size, mode, size,
                                                                                          resample, box, gap)


@pytest.mark.parametrize("width", [1, 3, 4, 7, 8, 9, 17, 31])
def test_every_instruction_set_emits_numpys_values(width: int, isa: int, flavour: int) -> None:
    """uint8 and normalized outs, flipped or not, at widths around the SIMD rows' 4 and 8 pixels."""
    for mode in ("RGB", "L"):
        img = make_image(np.random.default_rng(width), 50, 40).convert(mode)
        raw, pixel = _stored(img)
        box = (1.5, 2.0, 48.0, 39.5)
        plain = _pillows(img, (width, 5), Image.Resampling.BILINEAR, box, None)
        c = plain.shape[2]
        for hflip in (False, True):
            pixels = plain[:, ::-1] if hflip else plain
            got = _ours(img, (width, 5), Image.Resampling.BILINEAR, box, None, flavour, hflip)
            assert np.array_equal(got, pixels), (mode, hflip)
            for chw in (True, False):
                expected = _normalized(pixels, chw)
                out = np.full(expected.shape, np.nan, np.float32)
                EXT.resample_into(raw, 50, 40, pixel, 50 * pixel, box, Image.Resampling.BILINEAR, 0.0, hflip,
                                         False, out, MEAN[:c], INV[:c], chw, flavour)
                assert np.array_equal(out, expected), (mode, hflip, chw)


def test_flips_mirror_the_result_and_rgbx_reads_like_rgb(flavour: int) -> None:
    img = make_image(np.random.default_rng(4), 91, 67)
    box = (3.5, 2.0, 88.25, 60.5)
    plain = _pillows(img, (40, 30), Image.Resampling.BICUBIC, box, None)
    for hflip in (False, True):
        for vflip in (False, True):
            expected = plain[:, ::-1] if hflip else plain
            expected = expected[::-1] if vflip else expected
            got = _ours(img, (40, 30), Image.Resampling.BICUBIC, box, None, flavour, hflip, vflip)
            assert np.array_equal(got, expected), (hflip, vflip)
    rgbx = np.frombuffer(img.convert("RGBX").tobytes(), np.uint8).reshape(67, 91, 4).copy()
    rgbx[:, :, 3] = np.random.default_rng(5).integers(0, 256, (67, 91))  # the fourth byte is never read into out
    out = np.empty((30, 40, 3), np.uint8)
    EXT.resample_into(rgbx, 91, 67, 4, 91 * 4, box, Image.Resampling.BICUBIC, 0.0, False, False, out, None, None,
                             False, flavour)
    assert np.array_equal(out, plain)


def _normalized(pixels: np.ndarray, chw: bool) -> np.ndarray:
    """thread_epoch's NumPy normalize: float32 ``(pixels - mean) * inv``."""
    mean, inv = MEAN[: pixels.shape[2]], INV[: pixels.shape[2]]
    out = pixels.astype(np.float32)
    np.subtract(out, mean, out=out)
    np.multiply(out, inv, out=out)
    return np.ascontiguousarray(out.transpose(2, 0, 1)) if chw else out


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("chw", [True, False])
@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_normalized_outs_equal_numpys_arithmetic_bit_for_bit(dtype: Any, chw: bool, mode: str, flavour: int) -> None:
    img = make_image(np.random.default_rng(6), 120, 90).convert(mode)
    box = (4.5, 3.0, 117.0, 80.25)
    pixels = _pillows(img, (56, 48), Image.Resampling.BILINEAR, box, 3.0)[::-1, ::-1]
    expected = _normalized(pixels, chw).astype(dtype)
    out = np.full(expected.shape, np.nan, dtype)
    c = pixels.shape[2]
    raw, pixel = _stored(img)
    assert native.resample_into(raw, 120, 90, pixel, 120 * pixel, out=out, box=box, resample=Image.Resampling.BILINEAR,
                                reducing_gap=3.0, hflip=True, vflip=True, mean=MEAN[:c], inv=INV[:c], chw=chw)
    assert np.array_equal(out, expected)


def test_float16_rounds_as_numpy_does_everywhere() -> None:
    """Tiny (subnormal halves), huge (infinities), ties, negatives: every pixel value at scales across the range."""
    pixels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1)
    raw = pixels.tobytes()
    for scale in (1e-9, 3e-8, 6.1e-5, 1e-3, 0.0078125, 1 / 3, 1.0, 255.9, 256.0, 257.0, 1e3, 1e5):
        for shift in (0.0, 127.5, 255.0):
            mean, inv = np.array([shift], np.float32), np.array([scale], np.float32)
            out = np.empty((16, 16, 1), np.float16)
            EXT.resample_into(raw, 16, 16, 1, 16, (0.0, 0.0, 16.0, 16.0), 2, 0.0, False, False, out, mean, inv,
                                     False, 0)
            with np.errstate(over="ignore"):  # the infinities are the point
                expected = ((pixels.astype(np.float32) - mean) * inv).astype(np.float16)
            assert np.array_equal(out.view(np.uint16), expected.view(np.uint16)), (scale, shift)


def test_what_pillow_refuses_is_refused_and_outs_are_checked(flavour: int) -> None:
    img = Image.fromarray(np.zeros((10, 12, 3), np.uint8))
    for box in [(-1.0, 0.0, 5.0, 5.0), (0.0, 0.0, 13.0, 5.0), (6.0, 0.0, 5.0, 5.0)]:
        with pytest.raises(ValueError):
            img.resize((4, 4), Image.Resampling.BILINEAR, box=box)
        with pytest.raises(ValueError):
            _ours(img, (4, 4), Image.Resampling.BILINEAR, box, None, flavour)
    with pytest.raises(ValueError, match="filter"):
        _ours(img, (4, 4), 9, (0.0, 0.0, 12.0, 10.0), None, flavour)
    with pytest.raises(ValueError, match="reducing_gap"):
        _ours(img, (4, 4), 2, (0.0, 0.0, 12.0, 10.0), 0.5, flavour)
    raw, box = bytes(12 * 10 * 4), (0.0, 0.0, 12.0, 10.0)
    bad = [(np.empty((4, 4, 1), np.uint8), None, "3 channels"), (np.empty((4, 4), np.uint8), None, "three"),
           (np.empty((4, 4, 3), np.int16), None, "uint8, float32"), (np.empty((4, 4, 3), np.float32), None, "mean"),
           (np.empty((4, 4, 3), np.uint8), MEAN, "mean")]
    for out, mean, message in bad:
        with pytest.raises(ValueError, match=message):
            EXT.resample_into(raw, 12, 10, 4, 48, box, 2, 0.0, False, False, out, mean, mean, False, flavour)
    with pytest.raises(ValueError, match="rows"):
        EXT.resample_into(raw[:-1], 12, 10, 4, 48, box, 2, 0.0, False, False, np.empty((4, 4, 3), np.uint8),
                                 None, None, False, flavour)


def _jpeg(width: int, height: int, gray: bool = False) -> bytes:
    img = make_image(np.random.default_rng(width + height), width, height)
    buf = io.BytesIO()
    (img.convert("L") if gray else img).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("gray", [False, True])
@pytest.mark.parametrize("denom", [1, 2])
def test_sample_into_equals_decode_region_crop_and_resize(gray: bool, denom: int, flavour: int) -> None:
    """The chained call against the steps it chains, done with pil_fast and Pillow."""
    raw = _jpeg(333, 257, gray)
    img = Image.open(io.BytesIO(raw))
    needed, window = (30 // denom, 20 // denom, 300 // denom, 240 // denom), (35 // denom, 22 // denom, 290, 230)
    box = (40.5 / denom, 25.25 / denom, 280.75 / denom, 201.0 / denom)
    found = pil_fast.decode_region(img, raw, denom, needed)
    assert found is not None
    region, left, top = found
    clip = (max(window[0], left) - left, max(window[1], top) - top,
            min(window[2], left + region.width) - left, min(window[3], top + region.height) - top)
    cropped = region.crop(clip)
    relative = (box[0] - left - clip[0], box[1] - top - clip[1], box[2] - left - clip[0], box[3] - top - clip[1])
    c = 1 if gray else 3
    for resample in (Image.Resampling.BILINEAR, Image.Resampling.LANCZOS):
        resized = cropped.resize((64, 48), resample, box=relative, reducing_gap=3.0)
        expected = np.asarray(resized)
        expected = (expected[:, :, None] if gray else expected[:, :, :3])[:, ::-1]
        out = np.empty((48, 64, c), np.uint8)
        m = pil_fast.REGION_MARGIN
        with_margin = (max(0, needed[0] - m), max(0, needed[1] - m), needed[2] + m, needed[3] + m)
        assert native.sample_into(raw, denom=denom, gray=gray, region=with_margin, window=window, box=box, out=out,
                                  resample=resample, reducing_gap=3.0, hflip=True)
        assert np.array_equal(out, expected)
        normalized = np.empty((c, 48, 64), np.float32)
        assert native.sample_into(raw, denom=denom, gray=gray, region=with_margin, window=window, box=box,
                                  out=normalized, resample=resample, reducing_gap=3.0, hflip=True, mean=MEAN[:c],
                                  inv=INV[:c], chw=True)
        assert np.array_equal(normalized, _normalized(expected, True))
    with pytest.raises(ValueError):
        native.sample_into(raw[: len(raw) // 4], denom=denom, gray=gray, region=(0, 0, 333, 257), window=window,
                           box=box, out=out, resample=2)


def test_the_gil_is_released_while_resizing(flavour: int) -> None:
    """Python runs in another thread while a resize is under way (with the GIL held it could not)."""
    src = np.random.default_rng(7).integers(0, 256, (1500, 1500, 4), dtype=np.uint8)
    out = np.empty((700, 900, 3), np.uint8)
    span: list[float] = []

    def work() -> None:
        span.append(time.perf_counter())
        EXT.resample_into(src, 1500, 1500, 4, 6000, (0.5, 0.5, 1499.5, 1499.5), Image.Resampling.LANCZOS, 0.0,
                                 False, False, out, None, None, False, flavour)
        span.append(time.perf_counter())

    worker = threading.Thread(target=work)
    ticks = []
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    assert any(span[0] < t < span[1] for t in ticks)


def test_without_the_extension_or_a_matching_pillow_callers_use_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "resample_flavour", lambda: None)
    out = np.empty((2, 2, 3), np.uint8)
    assert not native.resample_into(bytes(64), 4, 4, 4, 16, out=out, box=(0.0, 0.0, 4.0, 4.0), resample=2)
    assert not native.sample_into(b"", denom=1, gray=False, region=(0, 0, 1, 1), window=(0, 0, 1, 1),
                                  box=(0.0, 0.0, 1.0, 1.0), out=out, resample=2)
