"""Image ops on pixel values: normalize, colour jitter, grayscale, blur."""

from __future__ import annotations

from typing import Any

from feedfast.ops import _dali as d
from feedfast.ops import threaded as th
from feedfast.ops.base import OpDef, Param, Rng, Signature, SignatureError, positive_range, require, same_image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _normalize_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    require(sig, kind=("image",), op="normalize")
    c = sig.shape[2]
    for key in ("mean", "std"):
        if c is not None and len(p[key]) not in (1, c):
            raise SignatureError(f"`{key}` has {len(p[key])} values for an image of {c} channels")
    if any(s <= 0 for s in p["std"]):
        raise SignatureError(f"`std` values must be > 0, got {list(p['std'])}")
    h, w = sig.shape[0], sig.shape[1]
    shape = (c, h, w) if p["layout"] == "CHW" else (h, w, c)
    return Signature("tensor", shape, p["dtype"], p["layout"], sig.device)


def _dali_dtype(name: str) -> Any:
    t = d.types()
    return {"float32": t.FLOAT, "float16": t.FLOAT16, "uint8": t.UINT8}[name]


def _normalize_dali(ctx: Any, p: dict[str, Any], x: Any, mirror: Any = 0) -> Any:
    return d.fn().crop_mirror_normalize(
        x, device=ctx.device, dtype=_dali_dtype(p["dtype"]), output_layout=p["layout"],
        mean=[m * 255.0 for m in p["mean"]], std=[s * 255.0 for s in p["std"]], mirror=mirror,
    )


def _normalize_folded_dali(ctx: Any, params: dict[str, dict[str, Any]], x: Any) -> Any:
    """``normalize`` with the ``flip`` and/or ``center_crop`` folded into it: one ``crop_mirror_normalize``."""
    from feedfast.ops.base import as_hw

    norm = params["normalize"]
    mirror = 0
    if "flip" in params:  # the flag fed as data (compile.dali_draws), else DALI's coin
        mirror = ctx.fed["horizontal"] if ctx.fed else d.coin(params["flip"]["horizontal"])
    if "center_crop" not in params:
        return _normalize_dali(ctx, norm, x, mirror=mirror)
    h, w = as_hw(params["center_crop"]["size"])
    pos_x, pos_y = d.center_positions(ctx.in_hw, h, w)
    return d.fn().crop_mirror_normalize(
        x, device=ctx.device, dtype=_dali_dtype(norm["dtype"]), output_layout=norm["layout"],
        mean=[m * 255.0 for m in norm["mean"]], std=[s * 255.0 for s in norm["std"]],
        crop=[float(h), float(w)], crop_pos_x=pos_x, crop_pos_y=pos_y, out_of_bounds_policy="pad", mirror=mirror,
    )


def _normalize_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    import numpy as np
    import torch

    arr = np.asarray(img, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    t = torch.from_numpy(arr.copy())
    return normalize_tensor(t, p)


def normalize_tensor(t: Any, p: dict[str, Any]) -> Any:
    """Normalize a uint8 HWC (or NHWC) torch tensor as the spec's `normalize` says.

    Used by the portable backend and by the cheap-transfer pass, which normalizes on the
    consumer's device after a uint8 copy. The constants are made once per device and
    parameters, on the device itself (no host-to-device copy, so no host synchronization).
    """
    import torch

    dtype = {"float32": torch.float32, "float16": torch.float16}[p["dtype"]]
    mean, inv = _constants(t.device, tuple(p["mean"]), tuple(p["std"]))
    out = (t.to(torch.float32) - mean) * inv
    if p["layout"] == "CHW":
        out = out.movedim(-1, -3)
    return out.to(dtype).contiguous()


_CONSTANTS: dict[tuple[str, tuple[float, ...], tuple[float, ...]], tuple[Any, Any]] = {}


def _constants(device: Any, mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[Any, Any]:
    """``mean * 255`` and ``1 / (std * 255)`` as float32 tensors on ``device``, cached.

    Built with ``torch.full`` on the device: a fill kernel, never a blocking copy from host memory.
    """
    import torch

    key = (str(device), mean, std)
    found = _CONSTANTS.get(key)
    if found is None:
        def on_device(values: list[float]) -> Any:
            return torch.cat([torch.full((1,), v, dtype=torch.float32, device=device) for v in values])

        found = (on_device([m * 255.0 for m in mean]), on_device([1.0 / (s * 255.0) for s in std]))
        _CONSTANTS[key] = found
    return found


NORMALIZE = OpDef(
    "normalize",
    "scale to [0, 1], subtract mean, divide by std (torchvision units), cast, lay out",
    (
        Param("mean", "floats3", IMAGENET_MEAN, "per-channel mean in [0, 1] units", low=0, high=1),
        Param("std", "floats3", IMAGENET_STD, "per-channel std in [0, 1] units", low=0, high=10),
        Param("dtype", "str", "float32", "output type", choices=("float32", "float16")),
        Param("layout", "str", "CHW", "output layout", choices=("CHW", "HWC")),
    ),
    _normalize_infer,
    dali=_normalize_dali,
    pil=_normalize_pil,
    dali_name="crop_mirror_normalize",
    threaded=th.Threaded("normalize", plan_row=lambda p: []),
    absorbs=("flip", "center_crop"),
    dali_folded=_normalize_folded_dali,
)


def _factor(strength: float) -> tuple[float, float]:
    return max(0.0, 1.0 - strength), 1.0 + strength


def _gate(prob: float, value: Any, identity: float) -> Any:
    """``value`` with probability ``prob``, else ``identity`` (per sample)."""
    if prob >= 1.0 or isinstance(value, float):
        return value if prob > 0 else identity
    c = d.coin(prob)
    return identity + c * (value - identity)


def _jitter_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    prob = p["probability"]
    b = _gate(prob, d.uniform(*_factor(p["brightness"])), 1.0)
    c = _gate(prob, d.uniform(*_factor(p["contrast"])), 1.0)
    s = _gate(prob, d.uniform(*_factor(p["saturation"])), 1.0)
    h = _gate(prob, d.uniform(-p["hue"] * 360.0, p["hue"] * 360.0), 0.0)
    return d.fn().color_twist(x, device=ctx.device, brightness=b, contrast=c, saturation=s, hue=h)


def _jitter_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    from PIL import ImageEnhance

    if rng.random() >= p["probability"]:
        return img
    for key, enh in (("brightness", ImageEnhance.Brightness), ("contrast", ImageEnhance.Contrast),
                     ("saturation", ImageEnhance.Color)):
        img = enh(img).enhance(rng.uniform(*_factor(p[key])))
    if p["hue"] > 0:
        img = _shift_hue(img, rng.uniform(-p["hue"], p["hue"]))
    return img


def _shift_hue(img: Any, fraction: float) -> Any:
    import numpy as np
    from PIL import Image

    hsv = np.asarray(img.convert("HSV")).copy()
    hsv[..., 0] = (hsv[..., 0].astype(np.int16) + int(round(fraction * 255))) % 256
    return Image.fromarray(hsv, "HSV").convert("RGB")


COLOR_JITTER = OpDef(
    "color_jitter",
    "random brightness, contrast, saturation and hue (torchvision ColorJitter strengths)",
    (
        Param("brightness", "float", 0.4, "factor drawn from [max(0, 1-b), 1+b]", low=0, high=10),
        Param("contrast", "float", 0.4, "factor drawn from [max(0, 1-c), 1+c]", low=0, high=10),
        Param("saturation", "float", 0.4, "factor drawn from [max(0, 1-s), 1+s]", low=0, high=10),
        Param("hue", "float", 0.1, "shift drawn from [-h, h] turns of the colour wheel", low=0, high=0.5),
        Param("probability", "float", 1.0, "chance the jitter is applied to a sample", low=0, high=1),
    ),
    same_image("color_jitter", rgb=True),
    dali=_jitter_dali,
    pil=_jitter_pil,
    random=True,
    dali_name="color_twist",
)


def _gray_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    keep = 1.0 - d.coin(p["probability"]) if p["probability"] < 1 else 0.0
    return d.fn().hsv(x, device=ctx.device, saturation=keep)


def _gray_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    if rng.random() < p["probability"]:
        return img.convert("L").convert("RGB")
    return img


RANDOM_GRAYSCALE = OpDef(
    "random_grayscale",
    "with a probability, drop colour (three equal channels)",
    (Param("probability", "float", 0.2, "chance a sample turns gray", low=0, high=1),),
    same_image("random_grayscale", rgb=True),
    dali=_gray_dali,
    pil=_gray_pil,
    random=True,
    dali_name="hsv",
)


def _blur_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    fn, t = d.fn(), d.types()
    blurred = fn.gaussian_blur(x, device=ctx.device, sigma=d.uniform(*p["sigma"]))
    if p["probability"] >= 1.0:
        return blurred
    c = d.coin(p["probability"])
    mixed = fn.cast(x, dtype=t.FLOAT) + c * (fn.cast(blurred, dtype=t.FLOAT) - fn.cast(x, dtype=t.FLOAT))
    return fn.cast(mixed, dtype=t.UINT8)


def _blur_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    from PIL import ImageFilter

    if rng.random() >= p["probability"]:
        return img
    return img.filter(ImageFilter.GaussianBlur(rng.uniform(*p["sigma"])))


def _blur_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    positive_range("sigma", p["sigma"])
    return same_image("gaussian_blur")(sig, p)


GAUSSIAN_BLUR = OpDef(
    "gaussian_blur",
    "Gaussian blur with a random sigma, applied with a probability",
    (
        Param("sigma", "range", (0.1, 2.0), "sigma range in pixels", low=0, high=100),
        Param("probability", "float", 1.0, "chance a sample is blurred", low=0, high=1),
    ),
    _blur_infer,
    dali=_blur_dali,
    pil=_blur_pil,
    random=True,
    dali_name="gaussian_blur",
)
