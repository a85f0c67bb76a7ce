"""feedfast._augment's kernels equal the installed Pillow's own calls, pixel for pixel; autoaug's array forms
with and without the extension equal the PIL forms.

Images: uniform noise, narrow and sparse value ranges (where autocontrast and equalize tables bend or clip),
constant ones, a synthetic photo and a natural one, one channel and three, odd and even sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageFilter, ImageOps, ImageStat

from feedfast.ops import autoaug, autoaug_arrays
from tests.corpus import photo

ext: Any = autoaug_arrays._augment
needs_ext = pytest.mark.skipif(ext is None, reason="feedfast._augment is not built here")

WIDE = autoaug.torchvision_space(31, 1, 1, wide=True)


def _signed(op: str) -> list[float]:
    """Every TrivialAugmentWide magnitude of ``op``, both signs."""
    magnitudes, signed = WIDE[op]
    return sorted({v for m in magnitudes for v in ([m, -m] if signed else [m])})


def _natural(w: int, h: int) -> np.ndarray | None:
    try:
        import matplotlib
    except ImportError:
        return None
    hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    return np.asarray(Image.open(hopper).convert("RGB").resize((w, h), Image.BILINEAR))


def _images() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    out = [rng.integers(0, 256, (37, 29, 3), dtype=np.uint8), rng.integers(0, 256, (24, 24, 1), dtype=np.uint8),
           rng.integers(90, 140, (19, 33, 3), dtype=np.uint8), np.asarray(photo(3, 41, 35).convert("RGB")),
           np.asarray(photo(4, 32, 32).convert("L"))[:, :, None], np.full((9, 14, 3), 77, dtype=np.uint8),
           rng.choice(np.array([0, 3, 9, 200, 255], dtype=np.uint8), (23, 17, 3), p=[.05, .05, .05, .05, .8]),
           rng.integers(0, 256, (1, 1, 3), dtype=np.uint8), rng.integers(0, 256, (2, 3, 1), dtype=np.uint8)]
    natural = _natural(61, 47)
    return out if natural is None else [*out, natural]


def _pil(arr: np.ndarray) -> Image.Image:
    return Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)


def _hwc(img: Image.Image) -> np.ndarray:
    out = np.asarray(img)
    return out[:, :, None] if out.ndim == 2 else out


def _fill(arr: np.ndarray, values: tuple[int, ...]) -> Any:
    return values[:arr.shape[2]] if arr.shape[2] == 3 else values[0]


def _run(kernel: Callable[..., Any], arr: np.ndarray, *args: Any) -> np.ndarray:
    out = np.empty_like(arr)
    kernel(arr, out, *args)
    return out


# --- affine ---------------------------------------------------------------------------------------------------

def _matrices(w: int, h: int) -> list[list[float]]:
    """torchvision's shears at every TA bin and sign, rotations at a spread of angles, timm's shears and
    fractional translations, and matrices for each of PIL's nearest engines (scaling, 16.16 fixed point,
    doubles where the corners leave fixed point's range)."""
    out = [autoaug.affine_matrix(autoaug.Choice(op, m), w, h) for op in ("ShearX", "ShearY") for m in _signed(op)]
    out += [autoaug.rotate_matrix(angle, w, h) for angle in (-135.0, -40.5, -4.5, 13.5, 90.0, 127.3, 200.0)]
    out += [autoaug.affine_matrix(autoaug.Choice(op, m, timm=True), w, h)
            for op in ("ShearX", "ShearY", "TranslateXRel", "TranslateYRel") for m in (-0.27, 0.13, 0.45)]
    out += [[1.0, 0.0, 2.5, 0.0, 1.0, -3.25], [0.5, 0.0, 0.0, 0.0, 2.0, 1.0], [-1.0, 0.0, w, 0.0, 1.0, 0.0],
            [1.0, 0.2, 5e4, 0.1, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0, 0.0, 0.0], [1.0, 0.3, -1e6, 0.0, 1.0, 0.0]]
    return [list(map(float, m)) for m in out if m is not None]


@pytest.fixture(params=[1, 0], ids=["avx2", "plain"])
def simd(request: pytest.FixtureRequest) -> Any:
    """The bilinear affine on AVX2 (where the CPU has it) and in plain C."""
    if ext is None:
        pytest.skip("feedfast._augment is not built here")
    if request.param and not ext.simd(1):
        pytest.skip("no AVX2 here")
    ext.simd(request.param)
    yield request.param
    ext.simd(1)


@pytest.mark.parametrize("resample", [Image.NEAREST, Image.BILINEAR], ids=["nearest", "bilinear"])
def test_affine_is_pil_s_transform_with_a_fill(resample: int, simd: int) -> None:
    for arr in _images():
        h, w, bands = arr.shape
        for matrix in _matrices(w, h):
            for fill in ((0, 0, 0), (10, 200, 30)):
                want = _pil(arr).transform((w, h), Image.AFFINE, matrix, resample, fillcolor=_fill(arr, fill))
                got = _run(ext.affine, arr, tuple(matrix), int(resample), bytes(fill[:bands]))
                assert np.array_equal(got, _hwc(want)), (arr.shape, matrix, fill)


@needs_ext
def test_affine_refuses_other_filters_shapes_and_fills() -> None:
    arr = np.zeros((4, 5, 3), dtype=np.uint8)
    identity = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="resample"):
        ext.affine(arr, np.empty_like(arr), identity, 3, b"\0\0\0")
    with pytest.raises(ValueError, match="fill"):
        ext.affine(arr, np.empty_like(arr), identity, 2, b"\0")
    with pytest.raises(ValueError, match="shape"):
        ext.affine(arr, np.empty((4, 6, 3), dtype=np.uint8), identity, 2, b"\0\0\0")
    with pytest.raises(ValueError, match="uint8"):
        ext.affine(np.zeros((4, 5, 2), dtype=np.uint8), np.empty((4, 5, 2), dtype=np.uint8), identity, 2, b"\0\0")
    with pytest.raises(ValueError, match="not be the pixels"):
        ext.affine(arr, arr, identity, 2, b"\0\0\0")


# --- tables, blends, histograms ----------------------------------------------------------------------------------

@needs_ext
def test_lut_is_image_point_with_one_table_or_one_per_channel() -> None:
    rng = np.random.default_rng(2)
    for arr in _images():
        bands = arr.shape[2]
        for size in {256, 256 * bands}:
            table = rng.integers(0, 256, size, dtype=np.uint8)
            lut = table.tolist() * (bands if size == 256 else 1)
            assert np.array_equal(_run(ext.lut, arr, table), _hwc(_pil(arr).point(lut))), (arr.shape, size)
    with pytest.raises(ValueError, match="table"):
        ext.lut(arr, np.empty_like(arr), bytes(100))


@needs_ext
def test_the_luma_is_the_installed_pil_s_convert_l_at_every_colour_and_column() -> None:
    """Every one of the 2**24 colours in groups of four (pillow-simd's SSE body), then random rows of
    every width up to 13 (its scalar tail), through blend with a table that returns the degenerate value."""
    flavour = autoaug_arrays.luma_flavour()
    assert flavour is not None, "neither Pillow's nor pillow-simd's convert('L')"
    identity = np.repeat(np.arange(256, dtype=np.uint8), 256)
    colours = np.arange(1 << 24, dtype=np.uint32)
    every = np.stack([colours >> 16, colours >> 8 & 255, colours & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)
    rng = np.random.default_rng(8)
    for arr in [every, *(rng.integers(0, 256, (50, w, 3), dtype=np.uint8) for w in range(1, 14))]:
        want = np.asarray(Image.fromarray(arr).convert("L"))
        assert np.array_equal(_run(ext.blend, arr, identity, None, flavour)[:, :, 0], want), arr.shape
        assert ext.histogram(arr, flavour) == Image.fromarray(want).histogram()


@needs_ext
def test_blend_is_image_enhance_color_and_sharpness_at_every_ta_factor() -> None:
    flavour = autoaug_arrays.luma_flavour()
    for arr in _images():
        img = _pil(arr)
        for m in _signed("Color"):
            table = autoaug_arrays._blend_table(1.0 + m)
            got = _run(ext.blend, arr, table, None, flavour)
            assert np.array_equal(got, _hwc(ImageEnhance.Color(img).enhance(1.0 + m))), (arr.shape, m)
            smooth = _hwc(img.filter(ImageFilter.SMOOTH))
            got = _run(ext.blend, arr, table, smooth, flavour)
            assert np.array_equal(got, _hwc(ImageEnhance.Sharpness(img).enhance(1.0 + m))), (arr.shape, m)
    with pytest.raises(ValueError, match="65536"):
        ext.blend(arr, np.empty_like(arr), bytes(256))
    with pytest.raises(ValueError, match="degenerate"):
        ext.blend(arr, np.empty_like(arr), bytes(65536), arr[:-1])


def test_smooth_is_the_installed_pil_s_filter_where_the_probe_says_so(simd: int) -> None:
    """pillow-simd's integer 3x3 SMOOTH on RGB at every size up to 19 x 7 and on the images above (the
    first and last rows and columns copied, images under 3 x 3 whole); with Pillow's own filter the probe
    says no and Sharpness smooths through PIL."""
    if not autoaug_arrays.smooth_in_c():
        pytest.skip("this PIL's SMOOTH is not pillow-simd's integer filter")
    rng = np.random.default_rng(12)
    sized = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for w in range(1, 20) for h in (1, 2, 3, 4, 7)]
    for arr in [*sized, *(a for a in _images() if a.shape[2] == 3)]:
        want = _pil(arr).filter(ImageFilter.SMOOTH)
        assert np.array_equal(_run(ext.smooth, arr), _hwc(want)), arr.shape
    with pytest.raises(ValueError, match="three channels"):
        ext.smooth(arr[:, :, :1].copy(), np.empty_like(arr[:, :, :1]))


@needs_ext
def test_histogram_and_gray_mean_are_pil_s() -> None:
    flavour = autoaug_arrays.luma_flavour()
    for arr in _images():
        img = _pil(arr)
        assert ext.histogram(arr) == img.histogram(), arr.shape
        assert ext.gray_mean(arr, flavour) == int(ImageStat.Stat(img.convert("L")).mean[0] + 0.5), arr.shape


@needs_ext
@pytest.mark.parametrize("name", ["autocontrast", "equalize"])
def test_autocontrast_and_equalize_are_image_ops(name: str) -> None:
    """ImageOps' own calls, on the images above and on sparse ones whose equalize table passes 255
    (Image.point clips it)."""
    rng = np.random.default_rng(6)
    sparse = [np.repeat(rng.choice(np.arange(256, dtype=np.uint8), (k, 1, 3)), rng.integers(1, 40), axis=1)
              for k in (2, 3, 30, 200)]
    lopsided = np.zeros((20, 30, 1), dtype=np.uint8)
    lopsided[:10] = np.arange(300, dtype=np.uint8).reshape(10, 30, 1) % 100
    lopsided[10:] = 200
    for arr in [*_images(), *sparse, lopsided]:
        want = getattr(ImageOps, name)(_pil(arr))
        assert np.array_equal(_run(getattr(ext, name), arr), _hwc(want)), (name, arr.shape)


# --- the array forms -------------------------------------------------------------------------------------------

def _every_ta_choice(resample: int) -> list[autoaug.Choice]:
    return [autoaug.Choice(op, m, resample) for op in autoaug.TORCHVISION_WIDE for m in (_signed(op) or [0.0])]


def _timm_choices(resample: int) -> list[autoaug.Choice]:
    return [autoaug.Choice(op, m, resample, timm=True) for op in ("Rotate", "ShearX", "ShearY", "TranslateXRel",
                                                                  "TranslateYRel", "AutoContrast", "Equalize")
            for m in (-0.31, 0.0, 0.12, 17.0)]


def _assert_array_forms_are_pil_s(fill: tuple[int, ...], resample: int) -> None:
    square = np.random.default_rng(1).integers(0, 256, (25, 25, 3), dtype=np.uint8)  # rotate's quarter turns
    for arr in [*_images(), square]:
        for choice in [*_every_ta_choice(resample), *_timm_choices(resample)]:
            want = autoaug.apply(_pil(arr), [choice], fill)
            got = autoaug_arrays.apply_array(arr, [choice], fill)
            assert got.dtype == np.uint8 and got.shape == arr.shape, choice
            assert np.array_equal(got, _hwc(want)), (choice, arr.shape)


@needs_ext
@pytest.mark.parametrize("resample", [Image.NEAREST, Image.BILINEAR], ids=["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [(0,), (10, 200, 30)], ids=["fill0", "fill3"])
def test_every_ta_sub_op_at_every_bin_and_sign_is_its_pil_form(fill: tuple[int, ...], resample: int) -> None:
    _assert_array_forms_are_pil_s(fill, int(resample))


@pytest.mark.parametrize("resample", [Image.NEAREST, Image.BILINEAR], ids=["nearest", "bilinear"])
def test_without_the_extension_the_array_forms_are_still_pil_s(monkeypatch: pytest.MonkeyPatch,
                                                               resample: int) -> None:
    monkeypatch.setattr(autoaug_arrays, "_augment", None)
    probes = (autoaug_arrays.luma_flavour, autoaug_arrays.smooth_in_c)
    for probe in probes:
        probe.cache_clear()
    try:
        assert autoaug_arrays.luma_flavour() is None and not autoaug_arrays.smooth_in_c()
        _assert_array_forms_are_pil_s((10, 200, 30), int(resample))
    finally:
        for probe in probes:
            probe.cache_clear()


@needs_ext
def test_rotate_s_shortcuts_are_pil_s_transposes() -> None:
    rng = np.random.default_rng(3)
    for arr in (rng.integers(0, 256, (12, 12, 3), dtype=np.uint8), rng.integers(0, 256, (12, 12, 1), dtype=np.uint8),
                rng.integers(0, 256, (9, 13, 3), dtype=np.uint8)):
        for angle in (0.0, 90.0, -90.0, 180.0, -180.0, 270.0, 360.0, 450.0):
            for resample in (Image.NEAREST, Image.BILINEAR):
                want = _pil(arr).rotate(angle, resample, fillcolor=_fill(arr, (1, 2, 3)))
                got = autoaug_arrays.apply_array(arr, [autoaug.Choice("Rotate", angle, int(resample))], (1, 2, 3))
                assert np.array_equal(got, _hwc(want)), (arr.shape, angle, resample)
