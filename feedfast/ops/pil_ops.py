"""The PIL forms of the geometry and colour ops (the ``pil`` and ``threads`` backends' implementation).

Each function reproduces the torchvision (``transforms`` v1 / ``functional``) semantics for
PIL images, including its rounding rules, so a spec gives the pixels a torchvision user
expects on every backend. Randomness comes from an explicit ``random.Random`` instead of
torch's global RNG. The op registry (:mod:`feedfast.ops.geometry`) calls them; comparisons
against torchvision run torchvision itself (:mod:`feedfast.baseline.torch_recipe`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from feedfast.errors import UserError
from feedfast.ops.base import Rng

_MAX_ATTEMPTS = 10
"""torchvision's RandomResizedCrop tries this many random boxes before its fallback."""


def _check_range(name: str, pair: Sequence[float], lowest: float) -> tuple[float, float]:
    """Return ``pair`` as ``(lo, hi)`` floats; raise ``UserError`` unless ``lowest < lo <= hi``."""
    if len(pair) != 2 or not lowest < pair[0] <= pair[1]:
        example = "(0.08, 1.0)" if name == "scale" else "(3/4, 4/3)"
        raise UserError(
            f"{name} must be a pair (lo, hi) with {lowest} < lo <= hi, got {tuple(pair)!r}; "
            f"pass e.g. {name}={example}"
        )
    return float(pair[0]), float(pair[1])


def random_resized_crop_params(
    width: int,
    height: int,
    scale: Sequence[float],
    ratio: Sequence[float],
    rng: Rng,
) -> tuple[int, int, int, int]:
    """Pick a random crop box the way ``torchvision.transforms.RandomResizedCrop.get_params`` does.

    Up to 10 times: draw an area fraction uniformly from ``scale`` and an aspect ratio
    (width / height) log-uniformly from ``ratio``; accept the first box that fits and place it
    uniformly. Otherwise fall back to the largest central crop whose aspect ratio is clamped
    to ``ratio`` (the whole image when its ratio is already inside). One deviation: where
    torchvision's fallback rounds a side to 0 (images a pixel or two wide), it is kept at 1.

    Args:
        width: Image width in pixels, >= 1.
        height: Image height in pixels, >= 1.
        scale: ``(lo, hi)`` bounds of the crop area as a fraction of the image area.
        ratio: ``(lo, hi)`` bounds of the crop aspect ratio (width / height).
        rng: Source of randomness.

    Returns:
        ``(top, left, h, w)`` of the crop, always inside the image.

    Raises:
        UserError: If the image is empty or ``scale``/``ratio`` are not increasing positive pairs.
    """
    if width < 1 or height < 1:
        raise UserError(f"image must be at least 1x1, got {width}x{height}; skip empty images")
    scale_lo, scale_hi = _check_range("scale", scale, 0.0)
    ratio_lo, ratio_hi = _check_range("ratio", ratio, 0.0)
    area = width * height
    log_lo, log_hi = math.log(ratio_lo), math.log(ratio_hi)
    for _ in range(_MAX_ATTEMPTS):
        target_area = area * rng.uniform(scale_lo, scale_hi)
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < ratio_lo:
        w, h = width, max(1, int(round(width / ratio_lo)))
    elif in_ratio > ratio_hi:
        w, h = max(1, int(round(height * ratio_hi))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_resized_crop(
    img: Image.Image,
    size: int | tuple[int, int],
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    *,
    rng: Rng,
    interpolation: Image.Resampling = Image.BILINEAR,
) -> Image.Image:
    """Crop a random box (see :func:`random_resized_crop_params`) and resize it to ``size``.

    Args:
        img: Input image.
        size: Output size: an int for a square, or ``(height, width)`` as in torchvision.
        scale: Bounds of the crop area as a fraction of the image area.
        ratio: Bounds of the crop aspect ratio (width / height).
        rng: Source of randomness.
        interpolation: PIL resampling filter (torchvision's default is bilinear).

    Returns:
        The resized crop, ``size`` pixels.
    """
    out_h, out_w = (size, size) if isinstance(size, int) else size
    top, left, h, w = random_resized_crop_params(img.width, img.height, scale, ratio, rng)
    crop = img.crop((left, top, left + w, top + h))
    return crop.resize((out_w, out_h), interpolation)


def resize_shorter(
    img: Image.Image, size: int, interpolation: Image.Resampling = Image.BILINEAR
) -> Image.Image:
    """Resize so the shorter side is ``size``, as ``torchvision.transforms.Resize(int)`` does.

    The longer side becomes ``int(size * long / short)`` (truncated, torchvision's rule), and
    an image that already has the output size is returned unchanged.

    Args:
        img: Input image.
        size: Target length of the shorter side, >= 1.
        interpolation: PIL resampling filter.

    Returns:
        The resized image.

    Raises:
        UserError: If ``size`` is below 1.
    """
    if size < 1:
        raise UserError(f"resize size must be >= 1, got {size!r}; pass e.g. 256")
    width, height = img.size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    if (new_w, new_h) == (width, height):
        return img
    return img.resize((new_w, new_h), interpolation)


def center_crop(img: Image.Image, size: int | tuple[int, int]) -> Image.Image:
    """Crop the centre, as ``torchvision.transforms.functional.center_crop`` does.

    The box starts at ``top = int(round((h - th) / 2.0))`` and
    ``left = int(round((w - tw) / 2.0))``. A crop larger than the image first zero-pads it,
    ``(th - h) // 2`` rows above and ``(tw - w) // 2`` columns left, like torchvision.

    Args:
        img: Input image.
        size: Output size: an int for a square, or ``(height, width)``.

    Returns:
        The ``size`` crop.
    """
    th, tw = (size, size) if isinstance(size, int) else size
    width, height = img.size
    if th > height or tw > width:
        padded = Image.new(img.mode, (max(width, tw), max(height, th)))
        padded.paste(img, (max(tw - width, 0) // 2, max(th - height, 0) // 2))
        img = padded
        width, height = img.size
        if (width, height) == (tw, th):
            return img
    top = int(round((height - th) / 2.0))
    left = int(round((width - tw) / 2.0))
    return img.crop((left, top, left + tw, top + th))


def hflip(img: Image.Image) -> Image.Image:
    """Mirror the image left to right.

    Args:
        img: Input image.

    Returns:
        The flipped image.
    """
    return img.transpose(Image.FLIP_LEFT_RIGHT)


def to_tensor(img: Image.Image) -> torch.Tensor:
    """Convert to a contiguous float32 CHW tensor in ``[0, 1]``, like ``ToTensor`` for 8-bit images.

    Args:
        img: An 8-bit image (mode ``L``, ``RGB``, ``RGBA`` or any other 8-bit-per-band mode).

    Returns:
        A ``(bands, height, width)`` float32 tensor.

    Raises:
        UserError: If the image is not 8 bits per band (e.g. mode ``I`` or ``F``).
    """
    arr = np.array(img, copy=True)
    if arr.dtype != np.uint8:
        raise UserError(
            f"to_tensor needs an 8-bit image, got mode {img.mode!r}; convert('RGB') first"
        )
    if arr.ndim == 2:
        arr = arr[:, :, None]
    hwc = torch.from_numpy(arr)
    return hwc.permute(2, 0, 1).contiguous().to(torch.float32).div_(255.0)


def normalize(t: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Normalise channels in place: ``t[c] = (t[c] - mean[c]) / std[c]``, like ``Normalize``.

    Args:
        t: Float tensor ``(C, H, W)`` or ``(B, C, H, W)``; modified in place.
        mean: Per-channel means, length ``C``.
        std: Per-channel standard deviations, length ``C``, none zero.

    Returns:
        ``t`` itself.

    Raises:
        UserError: If a ``std`` is zero or the lengths do not match the channel count.
    """
    channels = t.shape[-3]
    if len(mean) != channels or len(std) != channels:
        raise UserError(
            f"normalize: mean and std need {channels} values, got {len(mean)} and {len(std)}; "
            "pass one per channel"
        )
    if any(s == 0 for s in std):
        raise UserError(f"normalize: std must be non-zero, got {tuple(std)!r}; fix the std values")
    mean_t = torch.as_tensor(mean, dtype=t.dtype).view(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=t.dtype).view(-1, 1, 1)
    return t.sub_(mean_t).div_(std_t)
