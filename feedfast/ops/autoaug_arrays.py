"""The automatic-augmentation policies' sub-ops on the threaded path's uint8 HWC arrays, PIL's pixels.

:func:`apply_array` is :func:`feedfast.ops.autoaug.apply` over an array: the same choices, the same
pixels (``tests/test_ops_recipe.py``, ``tests/test_augment.py``), without a PIL image where a sub-op
has an array form: ``feedfast._augment``'s kernels (``feedfast/_augment.c``) where it is built, else
tables and copies in NumPy; the rest goes through :mod:`feedfast.ops.autoaug`'s PIL forms.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

from feedfast.ops.autoaug import (
    Choice,
    _fill_values,
    _timm_op,
    _torchvision_op,
    affine_matrix,
    rotate_matrix,
    rotate_turn,
)

try:
    import feedfast._augment as _augment
except ImportError:  # not built at install: Pillow and NumPy run the array forms
    _augment = None


_POINTWISE = frozenset({"Brightness", "Posterize", "Solarize", "Invert"})
"""torchvision sub-ops that map each channel value through one table whatever the image (PIL builds the
table per band from the same function, or blends with a constant image)."""
_POINTWISE_TIMM = frozenset({"Brightness", "BrightnessIncreasing", "Posterize", "PosterizeIncreasing", "Solarize",
                             "SolarizeIncreasing", "SolarizeAdd", "Invert"})
_HISTOGRAM_OPS = {"AutoContrast": "autocontrast", "Equalize": "equalize"}
"""Sub-ops whose tables come from the image's histogram (ImageOps' defaults, torchvision's and timm's alike):
the name of ``feedfast._augment``'s kernel."""


def kernels_built() -> bool:
    """Whether ``feedfast._augment`` is built and loads here (:func:`apply_array` then runs in C)."""
    return _augment is not None


def apply_array(pixels: Any, choices: Sequence[Choice], fill: Sequence[int]) -> Any:
    """:func:`apply` over uint8 HWC pixels (one or three channels), returning uint8 HWC pixels.

    The pixels are :func:`apply`'s. With ``feedfast._augment`` (``feedfast/_augment.c``), every sub-op
    but timm's continuous color and sharpness and the bicubic geometry runs on the array without the GIL:
    rotate, shear and timm's translations as PIL's affine transform (nearest and bilinear, ported), the
    table ops (brightness, posterize, solarize, invert; contrast, whose table depends on the image's
    mean only) as their table, made by the same PIL call on the 256 values, autocontrast and equalize
    from the histogram as ImageOps does, torchvision's color and sharpness as a table of PIL's blend over
    (degenerate, value) pairs (the gray and smoothed images in C where they are the installed PIL's, by
    a probe). Whole-pixel translations are a copy, Identity no work. Without it, the
    tables and copies run in NumPy and the rest through PIL. Measured on 176 x 176 RGB, one thread: see
    docs/benchmarks-history.md ("The recipe row").
    """
    import numpy as np

    state: Any = pixels
    for choice in choices:
        if choice.op == "Identity":
            continue
        if isinstance(state, np.ndarray):
            done = _array_op(np.ascontiguousarray(state), choice, fill)
            if done is not None:
                state = done
                continue
            state = _to_pil(state)
        state = (_timm_op if choice.timm else _torchvision_op)(state, choice, fill)
    if isinstance(state, np.ndarray):
        return state
    out = np.asarray(state)
    return out[:, :, None] if out.ndim == 2 else out


def _array_op(pixels: Any, choice: Choice, fill: Sequence[int]) -> Any:
    """One sub-op on the array, or None where it must go through PIL."""
    lut = _table(pixels, choice, fill)
    if lut is not None:
        return _apply_table(pixels, lut)
    for form in (_integer_shift, _geometry, _histogram_op):
        out = form(pixels, choice, fill)
        if out is not None:
            return out
    return _blend_enhance(pixels, choice)


def _apply_table(pixels: Any, lut: Any) -> Any:
    import numpy as np

    if _augment is None:
        return np.take(lut, pixels)
    out = np.empty_like(pixels)
    _augment.lut(pixels, out, lut)
    return out


def _geometry(pixels: Any, choice: Choice, fill: Sequence[int]) -> Any:
    """Rotate, shear and timm's translations through ``_augment.affine`` (PIL's nearest and bilinear affine
    transform; rotate's quarter turns and zero as PIL's transposes and copy). None for another op or filter."""
    import numpy as np

    if _augment is None or choice.resample not in (0, 2):  # Image.NEAREST, Image.BILINEAR
        return None
    height, width, bands = pixels.shape
    matrix: list[float] | None
    if choice.op == "Rotate":
        turn = rotate_turn(choice.magnitude, width, height)
        if turn is not None:
            return np.ascontiguousarray(np.rot90(pixels, turn)) if turn else pixels
        matrix = rotate_matrix(choice.magnitude, width, height)
    else:
        matrix = affine_matrix(choice, width, height)
        if matrix is None:
            return None
    out = np.empty_like(pixels)
    _augment.affine(pixels, out, tuple(matrix), choice.resample, bytes(_fill_values(fill, bands)))
    return out


def _histogram_op(pixels: Any, choice: Choice, fill: Sequence[int]) -> Any:
    import numpy as np

    kernel = _HISTOGRAM_OPS.get(choice.op)
    if _augment is None or kernel is None:
        return None
    out = np.empty_like(pixels)
    getattr(_augment, kernel)(pixels, out)
    return out


def _integer_shift(pixels: Any, choice: Choice, fill: Sequence[int]) -> Any:
    """torchvision's TranslateX / TranslateY as a copy, where its affine matrix is a shift by whole pixels
    (its translations are ``int(magnitude)``) and the filter samples pixel centres exactly (nearest,
    bilinear): every output pixel is one input pixel or the fill. None where that does not hold."""
    import numpy as np

    if choice.timm or choice.op not in ("TranslateX", "TranslateY") or choice.resample not in (0, 2):
        return None
    height, width, bands = pixels.shape
    m = affine_matrix(choice, width, height)
    assert m is not None
    if m[0] != 1.0 or m[1] != 0.0 or m[3] != 0.0 or m[4] != 1.0 or m[2] % 1.0 or m[5] % 1.0:
        return None
    dx, dy = -int(m[2]), -int(m[5])  # out[y, x] = in[y - dy, x - dx]
    out = np.empty_like(pixels)
    row = np.empty((width, bands), dtype=np.uint8)
    row[...] = _fill_values(fill, bands)
    out[...] = row  # a row of the fill, then rows: NumPy's broadcast of three values alone is 40x slower
    if abs(dx) < width and abs(dy) < height:
        out[max(dy, 0):height + min(dy, 0), max(dx, 0):width + min(dx, 0)] = \
            pixels[max(-dy, 0):height + min(-dy, 0), max(-dx, 0):width + min(-dx, 0)]
    return out


def _blend_enhance(pixels: Any, choice: Choice) -> Any:
    """torchvision's Color and Sharpness (``ImageEnhance``: a blend of the image with its gray or smoothed
    form) through a table of PIL's blend at the factor over every (degenerate, value) pair, which is
    PIL's by construction. torchvision's factors are a few bins, so the tables are cached; timm's are
    continuous and stay with PIL. None for another op."""
    import numpy as np

    if choice.timm or choice.op not in ("Color", "Sharpness"):
        return None
    table = _blend_table(1.0 + choice.magnitude)
    flavour = luma_flavour() if choice.op == "Color" else None
    degenerate: Any = None if flavour is not None else _degenerate(pixels, choice.op)
    if _augment is None:
        index = pixels.astype(np.uint16)
        index |= degenerate.astype(np.uint16) << 8
        return np.take(table, index)
    out = np.empty_like(pixels)
    _augment.blend(pixels, out, table, degenerate, flavour or 0)
    return out


def _degenerate(pixels: Any, op: str) -> Any:
    """Color's gray or Sharpness's smoothed image as uint8 HWC: ``_augment.smooth`` where it is the installed
    PIL's filter (:func:`smooth_in_c`), else PIL's own call. (Color's gray is made in ``_augment.blend`` where
    :func:`luma_flavour` knows the rule.)"""
    import numpy as np
    from PIL import ImageFilter

    if op == "Sharpness" and pixels.shape[2] == 3 and smooth_in_c():
        out = np.empty_like(pixels)
        _augment.smooth(pixels, out)
        return out
    img = _to_pil(pixels)
    found = np.asarray(img.convert("L") if op == "Color" else img.filter(ImageFilter.SMOOTH))
    return found[:, :, None] if found.ndim == 2 else found


@lru_cache(maxsize=1)
def smooth_in_c() -> bool:
    """Whether ``_augment.smooth`` (pillow-simd's integer 3x3 filter) is the installed PIL's
    ``filter(ImageFilter.SMOOTH)`` of RGB, on a probe of random pixels (Pillow's own filter rounds floats)."""
    import numpy as np
    from PIL import Image, ImageFilter

    if _augment is None:
        return False
    probe = np.random.default_rng(1).integers(0, 256, (9, 37, 3), dtype=np.uint8)
    out = np.empty_like(probe)
    _augment.smooth(probe, out)
    return bool(np.array_equal(out, np.asarray(Image.fromarray(probe).filter(ImageFilter.SMOOTH))))


@lru_cache(maxsize=1)
def luma_flavour() -> int | None:
    """Whose ``Image.convert("L")`` of RGB the installed PIL runs, as ``_augment`` names it: 0 Pillow's,
    1 pillow-simd's (its SSE groups of four pixels round another way); None when neither (or no ``_augment``):
    the gray image is then PIL's own."""
    import numpy as np
    from PIL import Image

    if _augment is None:
        return None
    probe = np.random.default_rng(0).integers(0, 256, (9, 37, 3), dtype=np.uint8)
    probe[0, :5] = (0, 1, 201)  # 24 by Pillow's rule, 23 by pillow-simd's in a group of four
    want = np.asarray(Image.fromarray(probe).convert("L"))
    identity = np.repeat(np.arange(256, dtype=np.uint8), 256)  # entry d * 256 + v: d
    for flavour in (0, 1):
        out = np.empty_like(probe)
        _augment.blend(probe, out, identity, None, flavour)
        if np.array_equal(out[:, :, 0], want):
            return flavour
    return None


@lru_cache(maxsize=256)
def _blend_table(factor: float) -> Any:
    """``Image.blend(a, b, factor)`` for every pair: entry ``a * 256 + b``."""
    import numpy as np
    from PIL import Image

    values = np.arange(256, dtype=np.uint8)
    a = Image.fromarray(np.ascontiguousarray(np.repeat(values[:, None], 256, axis=1)))
    b = Image.fromarray(np.ascontiguousarray(np.repeat(values[None, :], 256, axis=0)))
    return np.ascontiguousarray(np.asarray(Image.blend(a, b, factor)).reshape(65536))


def _to_pil(pixels: Any) -> Any:
    from PIL import Image

    return Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)


def _table(pixels: Any, choice: Choice, fill: Sequence[int]) -> Any:
    """The 256-entry table of a sub-op that is one per image, or None for a sub-op that is not."""
    if choice.op in (_POINTWISE_TIMM if choice.timm else _POINTWISE):
        return _pointwise_table(choice, tuple(fill))
    if choice.op in ("Contrast", "ContrastIncreasing") and (choice.timm or choice.op == "Contrast"):
        flavour = luma_flavour() if pixels.shape[2] == 3 else 0
        if flavour is not None and _augment is not None:
            mean = _augment.gray_mean(pixels, flavour)
        else:
            from PIL import ImageStat

            mean = int(ImageStat.Stat(_to_pil(pixels).convert("L")).mean[0] + 0.5)  # as ImageEnhance.Contrast
        return _contrast_table(mean, 1.0 + choice.magnitude if not choice.timm else choice.magnitude)
    return None


@lru_cache(maxsize=4096)
def _pointwise_table(choice: Choice, fill: tuple[int, ...]) -> Any:
    """The sub-op's own PIL call on a one-row L image of the values 0..255: its table."""
    import numpy as np

    out = np.asarray((_timm_op if choice.timm else _torchvision_op)(_ramp(), choice, fill))
    return np.ascontiguousarray(out.reshape(256))


@lru_cache(maxsize=4096)
def _contrast_table(mean: int, factor: float) -> Any:
    """``ImageEnhance.Contrast``'s blend with its solid ``mean`` image, over the values 0..255."""
    import numpy as np
    from PIL import Image

    out = Image.blend(Image.new("L", (256, 1), mean), _ramp(), factor)
    return np.ascontiguousarray(np.asarray(out).reshape(256))


@lru_cache(maxsize=1)
def _ramp() -> Any:
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.arange(256, dtype=np.uint8)[None, :])
