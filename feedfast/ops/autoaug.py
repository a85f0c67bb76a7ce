"""The automatic-augmentation policies on PIL images, as torchvision and timm define them.

A policy is two steps: :func:`choose` draws what to do to one image (a list of :class:`Choice`:
a sub-op, its magnitude and its filter) from the sample's draws, and :func:`apply` does it with
the same PIL calls as torchvision's functional ops (``transforms.autoaugment._apply_op`` on a
PIL image) or timm's (``timm.data.auto_augment``), so the pixels are theirs for the same choice
(``tests/test_ops_recipe.py`` checks each sub-op against their own code). The threaded path runs
the same choices on its uint8 arrays: :func:`feedfast.ops.autoaug_arrays.apply_array`.

Semantics, and which parameters select them:

- ``trivial_augment_wide``: torchvision's ``TrivialAugmentWide``: one of its 14 ops, a magnitude
  bin uniform over ``num_magnitude_bins`` (31), the sign of a signed magnitude a fair coin.
- ``rand_augment`` with ``flavour: torchvision`` (the default): torchvision's ``RandAugment``:
  ``num_ops`` ops drawn with replacement from its 14, each at the fixed bin ``magnitude`` of
  ``num_magnitude_bins``; a signed magnitude's sign a fair coin.
- ``rand_augment`` with ``flavour: timm``: timm's ``rand_augment_transform``: ``num_ops`` of its 15
  ops (``increasing: true`` is ``inc1``: timm's increasing variants of posterize, solarize and the
  enhancements), each applied with probability ``op_probability`` (0.5), at level ``magnitude`` on
  timm's 0..10 scale plus Gaussian noise of std ``magnitude_std`` (``mstd``), clipped to [0, 10];
  filters bilinear or bicubic at random, the fill timm's ImageNet mean (124, 116, 104). So
  ``rand-m9-mstd0.5-inc1`` is ``{flavour: timm, magnitude: 9, magnitude_std: 0.5, increasing: true}``.
- ``auto_augment``: torchvision's ``AutoAugment(AutoAugmentPolicy.IMAGENET)``.

Random numbers: where torchvision draws ``torch.randint(n)`` this draws ``rng.randint(0, n - 1)``,
``torch.rand`` ``rng.random()``; timm's ``random.gauss`` is a Box-Muller pair of draws. The
distributions are theirs; the draws are the sample's (a function of seed, epoch and sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from feedfast.ops.base import Rng

TORCHVISION_WIDE = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
                    "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
"""The op order of torchvision's ``TrivialAugmentWide`` and ``RandAugment`` (its draws index it)."""

TIMM_RAND = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
             "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
TIMM_RAND_INCREASING = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
                        "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing",
                        "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel",
                        "TranslateYRel")
"""timm's ``_RAND_TRANSFORMS`` and ``_RAND_INCREASING_TRANSFORMS`` (``inc1``)."""

TIMM_FILL = (124, 116, 104)
"""timm's fill: ``round(255 * ImageNet mean)``, as its transforms factory sets ``img_mean``."""

IMAGENET_POLICY = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)
"""torchvision's ``AutoAugmentPolicy.IMAGENET``: 25 pairs of (op, probability, magnitude bin of 10)."""


@dataclass(frozen=True)
class Choice:
    """One sub-op to apply: its name (torchvision's or timm's), magnitude (in the op's own units:
    degrees, pixels, an enhancement delta or factor, bits, a threshold) and PIL filter."""

    op: str
    magnitude: float = 0.0
    resample: int = 0  # Image.NEAREST
    timm: bool = False


def torch_linspace(start: float, end: float, steps: int) -> list[float]:
    """``torch.linspace(start, end, steps)`` in float32, value for value, as Python floats.

    torch fills the first half as ``start + step * i`` and the second as ``end - step * (steps - 1 - i)``,
    each a fused multiply-add in float32 (one rounding: exact in float64, then rounded).
    """
    import numpy as np
    lo, hi = float(np.float32(start)), float(np.float32(end))
    if steps == 1:
        return [lo]
    step = float(np.float32((np.float32(end) - np.float32(start)) / np.float32(steps - 1)))
    half = steps // 2
    return [float(np.float32(lo + step * i if i < half else hi - step * (steps - 1 - i))) for i in range(steps)]


@lru_cache(maxsize=64)
def torchvision_space(bins: int, height: int, width: int, *, wide: bool) -> dict[str, tuple[list[float], bool]]:
    """torchvision's ``_augmentation_space``: op -> (magnitudes, signed); an empty list for no magnitude.

    Cached (half a millisecond to build, per sample otherwise): callers must not change it.
    """
    import numpy as np
    top = 0.99 if wide else 0.9
    posterize_div = (bins - 1) / (6 if wide else 4)
    translate = (32.0, 32.0) if wide else (150.0 / 331.0 * width, 150.0 / 331.0 * height)
    posterize = [float(8 - int(np.round(np.float32(i) / np.float32(posterize_div)))) for i in range(bins)]
    return {
        "Identity": ([], False),
        "ShearX": (torch_linspace(0.0, top if wide else 0.3, bins), True),
        "ShearY": (torch_linspace(0.0, top if wide else 0.3, bins), True),
        "TranslateX": (torch_linspace(0.0, translate[0], bins), True),
        "TranslateY": (torch_linspace(0.0, translate[1], bins), True),
        "Rotate": (torch_linspace(0.0, 135.0 if wide else 30.0, bins), True),
        "Brightness": (torch_linspace(0.0, top, bins), True),
        "Color": (torch_linspace(0.0, top, bins), True),
        "Contrast": (torch_linspace(0.0, top, bins), True),
        "Sharpness": (torch_linspace(0.0, top, bins), True),
        "Posterize": (posterize, False),
        "Solarize": (torch_linspace(255.0, 0.0, bins), False),
        "AutoContrast": ([], False),
        "Equalize": ([], False),
        "Invert": ([], False),
    }


def choose_trivial_wide(rng: Rng, bins: int, resample: int) -> list[Choice]:
    """TrivialAugmentWide's draw: one op, a uniform magnitude bin, a random sign."""
    space = torchvision_space(bins, 1, 1, wide=True)
    op = TORCHVISION_WIDE[rng.randint(0, len(TORCHVISION_WIDE) - 1)]
    magnitudes, signed = space[op]
    magnitude = magnitudes[rng.randint(0, len(magnitudes) - 1)] if magnitudes else 0.0
    if signed and rng.randint(0, 1):
        magnitude = -magnitude
    return [Choice(op, magnitude, resample)]


def choose_rand_torchvision(rng: Rng, num_ops: int, magnitude: int, bins: int, height: int, width: int,
                            resample: int) -> list[Choice]:
    """torchvision RandAugment's draw: ``num_ops`` ops with replacement at the fixed bin ``magnitude``."""
    space = torchvision_space(bins, height, width, wide=False)
    out = []
    for _ in range(num_ops):
        op = TORCHVISION_WIDE[rng.randint(0, len(TORCHVISION_WIDE) - 1)]
        magnitudes, signed = space[op]
        value = magnitudes[magnitude] if magnitudes else 0.0
        if signed and rng.randint(0, 1):
            value = -value
        out.append(Choice(op, value, resample))
    return out


def choose_auto_imagenet(rng: Rng, height: int, width: int, resample: int) -> list[Choice]:
    """AutoAugment's ImageNet draw: a policy pair, each op applied when its draw is at most its probability."""
    space = torchvision_space(10, height, width, wide=False)
    pair = IMAGENET_POLICY[rng.randint(0, len(IMAGENET_POLICY) - 1)]
    probs = (rng.random(), rng.random())
    signs = (rng.randint(0, 1), rng.randint(0, 1))
    out = []
    for i, (op, p, bin_) in enumerate(pair):
        if probs[i] <= p:
            magnitudes, signed = space[op]
            value = magnitudes[bin_] if bin_ is not None else 0.0
            if signed and signs[i] == 0:
                value = -value
            out.append(Choice(op, value, resample))
    return out


def gauss(rng: Rng, mu: float, sigma: float) -> float:
    """A normal draw (Box-Muller over two of the sample's uniforms)."""
    u1, u2 = rng.random(), rng.random()
    return mu + sigma * math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)


def choose_rand_timm(rng: Rng, num_ops: int, magnitude: float, magnitude_std: float, increasing: bool,
                     probability: float, resamples: Sequence[int]) -> list[Choice]:
    """timm RandAugment's draw (``rand-m{magnitude}-mstd{magnitude_std}-inc{increasing}``)."""
    names = TIMM_RAND_INCREASING if increasing else TIMM_RAND
    out = []
    for _ in range(num_ops):
        op = names[rng.randint(0, len(names) - 1)]
        if probability < 1.0 and rng.random() > probability:
            continue
        level = gauss(rng, magnitude, magnitude_std) if magnitude_std > 0 else magnitude
        level = max(0.0, min(level, 10.0))
        value = _timm_level(op, level, rng)
        resample = resamples[rng.randint(0, len(resamples) - 1)] if len(resamples) > 1 else resamples[0]
        out.append(Choice(op, value, resample, timm=True))
    return out


def _negate(rng: Rng, v: float) -> float:
    return -v if rng.random() > 0.5 else v


def _timm_level(op: str, level: float, rng: Rng) -> float:
    """timm's ``LEVEL_TO_ARG`` for the RandAugment ops: the op's argument at ``level`` of 10."""
    f = level / 10.0
    if op == "Rotate":
        return _negate(rng, f * 30.0)
    if op in ("ShearX", "ShearY"):
        return _negate(rng, f * 0.3)
    if op in ("TranslateXRel", "TranslateYRel"):
        return _negate(rng, f * 0.45)
    if op == "Posterize":
        return float(int(f * 4))
    if op == "PosterizeIncreasing":
        return float(4 - int(f * 4))
    if op == "Solarize":
        return float(min(256, int(f * 256)))
    if op == "SolarizeIncreasing":
        return float(256 - min(256, int(f * 256)))
    if op == "SolarizeAdd":
        return float(min(128, int(f * 110)))
    if op.endswith("Increasing"):
        return max(0.1, 1.0 + _negate(rng, f * 0.9))
    if op in ("Color", "Contrast", "Brightness", "Sharpness"):
        return f * 1.8 + 0.1
    return 0.0  # AutoContrast, Equalize, Invert


def inverse_affine(center: Sequence[float], angle: float, translate: Sequence[float],
                   shear: Sequence[float]) -> list[float]:
    """torchvision's ``_get_inverse_affine_matrix`` (scale 1): the matrix PIL's ``transform`` takes."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d, -b, 0.0, -c, a, 0.0]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def apply(img: Any, choices: Sequence[Choice], fill: Sequence[int]) -> Any:
    """``img`` (PIL, L or RGB) through the chosen sub-ops, with ``fill`` for uncovered pixels."""
    for choice in choices:
        img = (_timm_op if choice.timm else _torchvision_op)(img, choice, fill)
    return img


def affine_matrix(c: Choice, width: int, height: int) -> list[float] | None:
    """The matrix ``Image.transform`` takes for torchvision's shears and translations (its
    ``F.affine`` through :func:`inverse_affine`) or timm's (``ShearX``, ``TranslateXRel``, ...); None for
    another op."""
    if c.timm:
        m = c.magnitude
        timm = {"ShearX": (1, m, 0, 0, 1, 0), "ShearY": (1, 0, 0, m, 1, 0),
                "TranslateXRel": (1, 0, m * width, 0, 1, 0), "TranslateYRel": (1, 0, 0, 0, 1, m * height)}.get(c.op)
        return list(timm) if timm is not None else None
    args = {
        "ShearX": ([0.0, 0.0], [0, 0], [math.degrees(math.atan(c.magnitude)), 0.0]),
        "ShearY": ([0.0, 0.0], [0, 0], [0.0, math.degrees(math.atan(c.magnitude))]),
        "TranslateX": ([width * 0.5, height * 0.5], [int(c.magnitude), 0], [0.0, 0.0]),
        "TranslateY": ([width * 0.5, height * 0.5], [0, int(c.magnitude)], [0.0, 0.0]),
    }.get(c.op)
    return inverse_affine(args[0], 0.0, args[1], args[2]) if args is not None else None


def rotate_turn(angle: float, width: int, height: int) -> int | None:
    """``Image.rotate(angle)``'s shortcuts (no expand, centre or translation): 0 for a copy, 1, 2 or 3
    quarter turns counter-clockwise (its transposes; 1 and 3 only for a square image); None for neither."""
    angle = angle % 360.0
    if angle == 0:
        return 0
    if angle == 180:
        return 2
    if angle in (90, 270) and width == height:
        return 1 if angle == 90 else 3
    return None


def rotate_matrix(angle: float, width: int, height: int) -> list[float]:
    """The matrix ``Image.rotate(angle)`` (no expand, centre or translation) hands ``Image.transform``, as it
    computes it (Pillow 12)."""
    angle = -math.radians(angle % 360.0)
    a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
    d, e = round(-math.sin(angle), 15), round(math.cos(angle), 15)
    cx, cy = width / 2, height / 2
    x, y = -cx - 0, -cy - 0  # the centre less the translation (none), through the matrix so far
    return [a, b, (a * x + b * y + 0.0) + cx, d, e, (d * x + e * y + 0.0) + cy]


def _fill_values(fill: Sequence[int], bands: int) -> tuple[int, ...]:
    """The fill, one value per band, as :func:`_fill` hands it to PIL."""
    values = tuple(int(v) for v in fill)
    values = values * bands if len(values) == 1 else values
    return values[:bands] if bands > 1 else values[:1]


def _fill(img: Any, fill: Sequence[int]) -> Any:
    values = _fill_values(fill, len(img.getbands()))
    return values if len(values) > 1 else values[0]


def _torchvision_op(img: Any, c: Choice, fill: Sequence[int]) -> Any:
    """torchvision's ``_apply_op`` on a PIL image, call for call."""
    from PIL import Image, ImageEnhance, ImageOps

    op, m = c.op, c.magnitude
    matrix = affine_matrix(c, img.width, img.height)
    if matrix is not None:
        return img.transform(img.size, Image.AFFINE, matrix, c.resample, fillcolor=_fill(img, fill))
    if op == "Rotate":
        return img.rotate(m, c.resample, False, None, fillcolor=_fill(img, fill))
    enhance = {"Brightness": ImageEnhance.Brightness, "Color": ImageEnhance.Color,
               "Contrast": ImageEnhance.Contrast, "Sharpness": ImageEnhance.Sharpness}.get(op)
    if enhance is not None:
        return enhance(img).enhance(1.0 + m)
    if op == "Posterize":
        return ImageOps.posterize(img, int(m))
    if op == "Solarize":
        return ImageOps.solarize(img, m)
    if op == "AutoContrast":
        return ImageOps.autocontrast(img)
    if op == "Equalize":
        return ImageOps.equalize(img)
    if op == "Invert":
        return ImageOps.invert(img)
    return img  # Identity


def _timm_op(img: Any, c: Choice, fill: Sequence[int]) -> Any:
    """timm's ``NAME_TO_OP`` functions on a PIL image, call for call."""
    from PIL import Image, ImageEnhance, ImageOps

    op, m = c.op, c.magnitude
    kw = {"resample": c.resample, "fillcolor": _fill(img, fill)}
    matrix = affine_matrix(c, img.width, img.height)
    if matrix is not None:
        return img.transform(img.size, Image.AFFINE, matrix, **kw)
    if op == "Rotate":
        return img.rotate(m, **kw)
    if op in ("Posterize", "PosterizeIncreasing"):
        return img if m >= 8 else ImageOps.posterize(img, int(m))
    if op in ("Solarize", "SolarizeIncreasing"):
        return ImageOps.solarize(img, m)
    if op == "SolarizeAdd":
        lut = [min(255, i + int(m)) if i < 128 else i for i in range(256)]
        return img.point(lut * len(img.getbands())) if img.mode in ("L", "RGB") else img
    base = op.removesuffix("Increasing")
    enhance = {"Brightness": ImageEnhance.Brightness, "Color": ImageEnhance.Color,
               "Contrast": ImageEnhance.Contrast, "Sharpness": ImageEnhance.Sharpness}.get(base)
    if enhance is not None:
        return enhance(img).enhance(m)
    if op == "AutoContrast":
        return ImageOps.autocontrast(img)
    if op == "Equalize":
        return ImageOps.equalize(img)
    if op == "Invert":
        return ImageOps.invert(img)
    return img
