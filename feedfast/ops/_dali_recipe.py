"""DALI forms of the recipe ops (:mod:`feedfast.ops.recipe`), over ``nvidia.dali.auto_aug``.

DALI's ``auto_aug`` runs the policies on the GPU (or the CPU) with conditionals
(``enable_conditionals``; :func:`feedfast.compile.dali.build_pipeline` turns them on when an op
declares ``conditionals``). Where DALI's ready-made suites differ from torchvision's, feedfast
builds torchvision's suite from DALI's own ``@augmentation`` ops with torchvision's ranges and
hands it to ``apply_trivial_augment`` / ``apply_rand_augment`` / ``apply_auto_augment``:

- ``trivial_augment_wide``: DALI's suite draws brightness, contrast and colour from
  [0.01, 0.99]; torchvision's from [0, 0.99]. feedfast's suite uses torchvision's.
- ``rand_augment``: DALI's suite translates by up to 100 pixels and solarizes from 256;
  torchvision translates by up to 150/331 of the image and solarizes from 255. feedfast's suite
  uses torchvision's (relative to the image's size where the plan knows it, as after a crop).
  timm's flavour (per-op probability, noisy magnitude, its increasing ops) has no DALI form: the
  emitter refuses it, naming the op, and the threaded or ``pil`` backend runs it.
- ``auto_augment``: DALI's ``auto_augment_image_net`` is the TPU EfficientNet "v0" policy
  (``equalize, shear_y`` first, ...), not torchvision's ``AutoAugmentPolicy.IMAGENET``. feedfast
  builds torchvision's 25 pairs as a DALI ``Policy`` of 10 bins.

What still differs, op by op, is DALI's kernels: shears and rotations are DALI's
``warp_affine`` about the image centre (torchvision shears about the top-left corner: the same
distortion, shifted), contrast blends towards the mean of DALI's luma weights, sharpness is a
3x3 kernel. Choices and magnitudes follow torchvision's distributions; pixels are DALI's.
Only the ``nearest`` and ``linear`` filters and a single fill value exist there.
"""

from __future__ import annotations

import math
from typing import Any

from feedfast.errors import BackendError
from feedfast.ops import _dali as d
from feedfast.ops import autoaug


def _interp(p: dict[str, Any], default: str = "nearest") -> Any:
    name = default if p.get("interpolation", "auto") == "auto" else p["interpolation"]
    t = d.types()
    if name not in ("nearest", "linear"):
        raise BackendError(f"DALI's auto_aug filters are nearest and linear, not {name!r}")
    return t.INTERP_NN if name == "nearest" else t.INTERP_LINEAR


def _fill(p: dict[str, Any]) -> int:
    fill = (0.0,) if p["fill"] == "auto" else p["fill"]
    if len(set(fill)) != 1:
        raise BackendError(f"DALI's auto_aug takes one fill value for every channel, got {list(fill)}")
    return int(round(fill[0]))


def _known_hw(ctx: Any) -> tuple[int, int] | None:
    hw = ctx.in_hw
    if hw is not None and all(isinstance(v, float) for v in hw):
        return int(hw[0]), int(hw[1])
    return None


def _color(ctx: Any, top: float) -> Any:
    """torchvision's Color: DALI's saturation blend; on one channel, where ``ImageEnhance.Color`` is the
    identity (its grey form is the image), the identity: DALI's ``color`` corrupts the heap on a
    one-channel image (DALI 2.4's CPU ``hsv``: "free(): invalid pointer", the process aborts)."""
    from nvidia.dali.auto_aug import augmentations as a

    if ctx.channels == 1:
        return a.identity.augmentation((0, top), True, name="color (one channel: the identity)")
    return a.color.augmentation((0, top), True, a.shift_enhance_range)


def _suite(ctx: Any, bins_top: float, wide: bool, translate: Any) -> list[Any]:
    from nvidia.dali.auto_aug import augmentations as a

    shear = 0.99 if wide else 0.3
    return translate + [
        a.shear_x.augmentation((0, shear), True),
        a.shear_y.augmentation((0, shear), True),
        a.rotate.augmentation((0, 135 if wide else 30), True),
        a.brightness.augmentation((0, bins_top), True, a.shift_enhance_range),
        a.contrast.augmentation((0, bins_top), True, a.shift_enhance_range),
        _color(ctx, bins_top),
        a.sharpness.augmentation((0, bins_top), True, a.sharpness_kernel),
        a.posterize.augmentation((8, 2 if wide else 4), False, a.poster_mask_uint8),
        a.solarize.augmentation((255, 0), False),
        a.auto_contrast,
        a.equalize,
        a.identity,
    ]


def trivial_augment_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    """torchvision's TrivialAugmentWide suite through DALI's ``apply_trivial_augment``."""
    from nvidia.dali.auto_aug import augmentations as a
    from nvidia.dali.auto_aug import trivial_augment

    translate = [a.translate_x_no_shape.augmentation((0, 32), True),
                 a.translate_y_no_shape.augmentation((0, 32), True)]
    return trivial_augment.apply_trivial_augment(
        _suite(ctx, 0.99, True, translate), x, num_magnitude_bins=p["num_magnitude_bins"],
        fill_value=_fill(p), interp_type=_interp(p),
    )


def rand_augment_refuses(p: dict[str, Any]) -> str | None:
    """Why DALI cannot run these ``rand_augment`` parameters, or None."""
    if p["flavour"] != "torchvision":
        return ("`rand_augment` with flavour timm (per-op probability, magnitude_std, increasing ops) has no DALI "
                "form; use flavour torchvision on DALI, or backend threads or pil")
    return None


def rand_augment_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    """torchvision's RandAugment suite through DALI's ``apply_rand_augment``."""
    from nvidia.dali.auto_aug import augmentations as a
    from nvidia.dali.auto_aug import rand_augment

    refused = rand_augment_refuses(p)
    if refused:
        raise BackendError(refused)
    hw = _known_hw(ctx)
    kwargs: dict[str, Any] = {"fill_value": _fill(p), "interp_type": _interp(p)}
    if hw is not None:
        rel = 150.0 / 331.0
        translate = [a.translate_x.augmentation((0, rel), True), a.translate_y.augmentation((0, rel), True)]
        kwargs["shape"] = hw
    else:  # the size varies per sample: torchvision's range at a 224-pixel image, in pixels
        top = 150.0 / 331.0 * 224
        translate = [a.translate_x_no_shape.augmentation((0, top), True),
                     a.translate_y_no_shape.augmentation((0, top), True)]
    return rand_augment.apply_rand_augment(
        _suite(ctx, 0.9, False, translate), x, n=p["num_ops"], m=p["magnitude"],
        num_magnitude_bins=p["num_magnitude_bins"], **kwargs,
    )


def auto_augment_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    """torchvision's ImageNet AutoAugment policy as a DALI ``Policy`` run by ``apply_auto_augment``."""
    from nvidia.dali.auto_aug import augmentations as a
    from nvidia.dali.auto_aug import auto_augment
    from nvidia.dali.auto_aug.core import Policy

    ops = {
        "Posterize": a.posterize.augmentation((8, 4), False, a.poster_mask_uint8),
        "Rotate": a.rotate.augmentation((0, 30), True),
        "Solarize": a.solarize.augmentation((255, 0), False),
        "AutoContrast": a.auto_contrast,
        "Equalize": a.equalize,
        "Color": _color(ctx, 0.9),
        "Contrast": a.contrast.augmentation((0, 0.9), True, a.shift_enhance_range),
        "Sharpness": a.sharpness.augmentation((0, 0.9), True, a.sharpness_kernel),
        "ShearX": a.shear_x.augmentation((0, 0.3), True),
        "Invert": a.invert,
    }
    pairs = [[(ops[name], prob, bin_) for name, prob, bin_ in pair] for pair in autoaug.IMAGENET_POLICY]
    policy = Policy("torchvision ImageNet", 10, pairs)
    return auto_augment.apply_auto_augment(policy, x, fill_value=_fill(p), interp_type=_interp(p))


def random_erasing_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    """torchvision's RandomErasing on a normalized tensor: the 10 attempts as arithmetic, then ``fn.erase``."""
    import nvidia.dali.math as dmath

    fn = d.fn()
    if ctx.in_hw is None:
        raise BackendError("`random_erasing` needs its input's size, which the plan lost")
    height, width = ctx.in_hw
    area = height * width
    log_lo, log_hi = math.log(p["ratio"][0]), math.log(p["ratio"][1])
    found: Any = 0.0
    box_h: Any = 0.0
    box_w: Any = 0.0
    for _ in range(10):  # the first attempt that fits wins, as in torchvision's loop
        target = area * fn.random.uniform(range=[float(p["scale"][0]), float(p["scale"][1])])
        aspect = dmath.exp(fn.random.uniform(range=[log_lo, log_hi]))
        h = dmath.floor(dmath.sqrt(target * aspect) + 0.5)
        w = dmath.floor(dmath.sqrt(target / aspect) + 0.5)
        take = (h < height) * (w < width) * (1.0 - found)
        box_h, box_w, found = box_h + take * h, box_w + take * w, found + take
    keep = d.coin(p["probability"]) * found
    top = dmath.floor(fn.random.uniform(range=[0.0, 1.0]) * (height - box_h + 1.0))
    left = dmath.floor(fn.random.uniform(range=[0.0, 1.0]) * (width - box_w + 1.0))
    anchor = fn.stack(top, left)
    shape = fn.stack(box_h * keep, box_w * keep)
    if p["value"] == "random":
        mask = fn.erase(x * 0.0 + 1.0, anchor=anchor, shape=shape, axis_names="HW", fill_value=0.0)
        return x * mask + fn.random.normal(x) * (1.0 - mask)
    values = [float(v) for v in p["value"]]  # several: one per channel, found by DALI from the layout's C
    return fn.erase(x, anchor=anchor, shape=shape, axis_names="HW", fill_value=values if len(values) > 1 else values[0])
