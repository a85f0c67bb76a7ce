"""The per-sample ops of the modern training recipes: TrivialAugmentWide, RandAugment, AutoAugment, RandomErasing.

Each runs on every backend, drawing from its own stream of the sample's draws with one chooser
per policy: the ``pil`` program on the PIL image (:func:`feedfast.ops.autoaug.apply`, torchvision's
and timm's PIL calls), the threaded path on the uint8 array (:func:`feedfast.ops.autoaug_arrays.apply_array`:
the same pixels, its sub-ops in ``feedfast._augment``'s C kernels without the GIL where that is built);
DALI through ``nvidia.dali.auto_aug`` (see :mod:`feedfast.ops._dali_recipe` for where DALI's suites differ
from torchvision's and what feedfast does about it).
``random_erasing`` works on the normalized tensor, after ``normalize``, as torchvision puts it.
"""

from __future__ import annotations

import math
from typing import Any

from feedfast.ops import _dali_recipe as dr
from feedfast.ops import autoaug, autoaug_arrays
from feedfast.ops import threaded as th
from feedfast.ops.base import OpDef, Param, Rng, Signature, SignatureError, positive_range, require, same_image

_AUG_INTERP = ("nearest", "linear", "cubic")
_TIMM_RANDOM = ("linear", "cubic")


def _filters(names: tuple[str, ...]) -> list[int]:
    from feedfast.ops.geometry import pil_interp

    return [int(pil_interp(n)) for n in names]


def _fill(p: dict[str, Any], timm: bool = False) -> tuple[int, ...]:
    if p["fill"] == "auto":
        return autoaug.TIMM_FILL if timm else (0,)
    return tuple(int(round(v)) for v in p["fill"])


def _array_kernel(choose: Any) -> Any:
    """A kernel over uint8 HWC pixels from a policy's draw (``choose(p, rng, height, width) -> (choices,
    fill)``, the same draw as its PIL form's): :func:`feedfast.ops.autoaug_arrays.apply_array`, PIL's pixels."""

    def kernel(arr: Any, p: dict[str, Any], rng: Rng) -> Any:
        choices, fill = choose(p, rng, arr.shape[0], arr.shape[1])
        return autoaug_arrays.apply_array(arr, choices, fill)

    return kernel


def _trivial_choices(p: dict[str, Any], rng: Rng, height: int, width: int) -> tuple[list[autoaug.Choice], tuple[int, ...]]:
    resample = _filters((p["interpolation"],))[0]
    return autoaug.choose_trivial_wide(rng, p["num_magnitude_bins"], resample), _fill(p)


def _rand_choices(p: dict[str, Any], rng: Rng, height: int, width: int) -> tuple[list[autoaug.Choice], tuple[int, ...]]:
    if p["flavour"] == "timm":
        names = _TIMM_RANDOM if p["interpolation"] in ("auto", "random") else (p["interpolation"],)
        choices = autoaug.choose_rand_timm(rng, p["num_ops"], float(p["magnitude"]), p["magnitude_std"],
                                           p["increasing"], p["op_probability"], _filters(names))
        return choices, _fill(p, timm=True)
    interp = "nearest" if p["interpolation"] == "auto" else p["interpolation"]
    choices = autoaug.choose_rand_torchvision(rng, p["num_ops"], p["magnitude"], p["num_magnitude_bins"],
                                              height, width, _filters((interp,))[0])
    return choices, _fill(p)


def _auto_choices(p: dict[str, Any], rng: Rng, height: int, width: int) -> tuple[list[autoaug.Choice], tuple[int, ...]]:
    resample = _filters((p["interpolation"],))[0]
    return autoaug.choose_auto_imagenet(rng, height, width, resample), _fill(p)


def _pil_form(choose: Any) -> Any:
    """The op's form on a PIL image (the pil program): the same draw, :func:`feedfast.ops.autoaug.apply`."""

    def augment(img: Any, p: dict[str, Any], rng: Rng) -> Any:
        choices, fill = choose(p, rng, img.height, img.width)
        return autoaug.apply(img, choices, fill)

    return augment


_trivial_augment = _pil_form(_trivial_choices)
_rand_augment = _pil_form(_rand_choices)
_auto_augment = _pil_form(_auto_choices)


_BINS = Param("num_magnitude_bins", "int", 31, "number of magnitude bins", low=2, high=1000)
_FILL = Param("fill", "fill", (0.0,), "value of uncovered pixels: a number or three (0..255)", low=0, high=255)
_INTERP = Param("interpolation", "str", "nearest", "filter of the geometric sub-ops (torchvision: nearest)",
                choices=_AUG_INTERP)


def _rand_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    same_image("rand_augment")(sig, p)
    if p["flavour"] == "torchvision":
        if p["magnitude"] >= p["num_magnitude_bins"]:
            raise SignatureError(f"`magnitude` {p['magnitude']} is a bin of `num_magnitude_bins` "
                                 f"({p['num_magnitude_bins']}): it must be smaller")
        if p["magnitude_std"] or p["increasing"] or p["interpolation"] == "random":
            raise SignatureError("`magnitude_std`, `increasing` and interpolation `random` are timm's knobs: "
                                 "add `flavour: timm`")
    elif p["magnitude"] > 10:
        raise SignatureError(f"timm's `magnitude` is a level of 0..10, got {p['magnitude']}")
    return sig


TRIVIAL_AUGMENT_WIDE = OpDef(
    "trivial_augment_wide",
    "torchvision TrivialAugmentWide: one of 14 ops at a random magnitude bin, signed at random",
    (_BINS, _INTERP, _FILL),
    same_image("trivial_augment_wide"),
    dali=dr.trivial_augment_dali,
    pil=_trivial_augment,
    random=True,
    dali_name="auto_aug.trivial_augment_wide",
    threaded=th.Threaded("kernel", kernel=_array_kernel(_trivial_choices)),
    conditionals=True,
)

RAND_AUGMENT = OpDef(
    "rand_augment",
    "RandAugment: torchvision's (flavour torchvision) or timm's rand-m9-mstd0.5-inc1 (flavour timm)",
    (
        Param("num_ops", "int", 2, "ops applied in a row", low=1, high=10),
        Param("magnitude", "int", 9, "torchvision: a bin of num_magnitude_bins; timm: a level of 0..10", low=0,
              high=999),
        _BINS,
        Param("flavour", "str", "torchvision", "whose semantics", choices=("torchvision", "timm")),
        Param("magnitude_std", "float", 0.0, "timm's mstd: Gaussian noise on the level per op", low=0, high=100),
        Param("increasing", "bool", False, "timm's inc1: the increasing variants of its ops"),
        Param("op_probability", "float", 0.5, "timm: the chance each chosen op is applied", low=0, high=1),
        Param("interpolation", "str", "auto", "auto: torchvision nearest, timm bilinear or bicubic at random",
              choices=("auto", "random", *_AUG_INTERP)),
        Param("fill", "fill", "auto", "auto: torchvision 0, timm (124, 116, 104); or a number or three",
              low=0, high=255, choices=("auto",)),
    ),
    _rand_infer,
    dali=dr.rand_augment_dali,
    pil=_rand_augment,
    random=True,
    dali_name="auto_aug.rand_augment",
    threaded=th.Threaded("kernel", kernel=_array_kernel(_rand_choices)),
    conditionals=True,
    dali_refuses=dr.rand_augment_refuses,
)

AUTO_AUGMENT = OpDef(
    "auto_augment",
    "torchvision AutoAugment with its ImageNet policy",
    (_INTERP, _FILL),
    same_image("auto_augment"),
    dali=dr.auto_augment_dali,
    pil=_auto_augment,
    random=True,
    dali_name="auto_aug.apply_auto_augment",
    threaded=th.Threaded("kernel", kernel=_array_kernel(_auto_choices)),
    conditionals=True,
)


def erase_box(rng: Rng, height: int, width: int, p: dict[str, Any]) -> tuple[int, int, int, int] | None:
    """torchvision ``RandomErasing``'s draw: (top, left, h, w) of the box, or None for no erasing.

    The coin first (``torch.rand(1) < p``), then up to 10 attempts of an area fraction uniform in
    ``scale`` and a log-uniform aspect ratio in ``ratio``, accepting the first box smaller than
    the image, placed uniformly.
    """
    if not rng.random() < p["probability"]:
        return None
    area = height * width
    log_lo, log_hi = math.log(p["ratio"][0]), math.log(p["ratio"][1])
    for _ in range(10):
        erase_area = area * rng.uniform(*p["scale"])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        h = int(round(math.sqrt(erase_area * aspect)))
        w = int(round(math.sqrt(erase_area / aspect)))
        if not (h < height and w < width):
            continue
        return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    return None


def _erase(arr: Any, p: dict[str, Any], rng: Rng) -> None:
    """Erase one normalized image in place (``p["layout"]``: its layout, given by the caller)."""
    import numpy as np

    chw = p["layout"] == "CHW"
    height, width = (arr.shape[1], arr.shape[2]) if chw else (arr.shape[0], arr.shape[1])
    box = erase_box(rng, height, width, p)
    if box is None:
        return
    top, left, h, w = box
    region = arr[:, top:top + h, left:left + w] if chw else arr[top:top + h, left:left + w, :]
    if p["value"] == "random":  # torchvision: standard normal per pixel; here from a generator the draws seed
        noise = np.random.default_rng(int(rng.random() * (1 << 53))).standard_normal(region.shape)
        region[...] = noise.astype(arr.dtype)
    else:
        value = np.asarray(p["value"], dtype=arr.dtype)
        region[...] = value[:, None, None] if chw else value


def _erase_pil(t: Any, p: dict[str, Any], rng: Rng) -> Any:
    _erase(t.numpy(), p, rng)  # the pil program's normalized tensor, in place
    return t


def _erase_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    if sig.kind == "image":
        raise SignatureError("`random_erasing` erases the normalized tensor, as torchvision's RandomErasing "
                             "after Normalize: put it after `normalize`")
    require(sig, kind=("tensor",), op="random_erasing")
    positive_range("scale", p["scale"])
    positive_range("ratio", p["ratio"])
    channels = sig.shape[0] if sig.layout == "CHW" else sig.shape[2]
    if p["value"] != "random" and channels is not None and len(p["value"]) not in (1, channels):
        raise SignatureError(f"`value` has {len(p['value'])} numbers for an image of {channels} channels")
    return sig


RANDOM_ERASING = OpDef(
    "random_erasing",
    "torchvision RandomErasing on the normalized tensor (put it after `normalize`)",
    (
        Param("probability", "float", 0.5, "chance a sample is erased", low=0, high=1),
        Param("scale", "range", (0.02, 0.33), "erased area as a fraction of the image", low=0, high=1),
        Param("ratio", "range", (0.3, 3.3), "aspect ratio range of the erased box", low=0, high=100),
        Param("value", "fill", (0.0,), "fill in normalized units: a number, three, or \"random\" (normal noise)",
              low=-100, high=100, choices=("random",)),
    ),
    _erase_infer,
    dali=dr.random_erasing_dali,
    pil=_erase_pil,
    random=True,
    dali_name="erase",
    threaded=th.Threaded("tensor", kernel=_erase),
)
