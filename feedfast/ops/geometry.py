"""Image ops that decode, crop, resize, flip and rotate."""

from __future__ import annotations

import math
from typing import Any

from feedfast.ops import _dali as d
from feedfast.ops import threaded as th
from feedfast.ops.base import DaliForm, OpDef, Param, Rng, Signature, as_hw, positive_range, require, same_image

_INTERP = Param("interpolation", "str", "linear", "resampling filter", choices=d.INTERPOLATIONS)
_SIZE = Param("size", "size", 224, "output size: an integer (square) or [height, width]", low=1, high=16384)


def _decode_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    require(sig, kind=("encoded",), op="decode")
    channels = 1 if p["color"] == "gray" else 3
    return Signature("image", (None, None, channels), "uint8", "HWC", sig.device)


def _decode_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    t = d.types()
    out = t.GRAY if p["color"] == "gray" else t.RGB
    return d.fn().decoders.image(x, device=ctx.decoder_device, output_type=out, **ctx.decoder_args)


def _decode_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    from feedfast.checks.decoders import to_8bit

    return to_8bit(img).convert("L" if p["color"] == "gray" else "RGB")  # 16-bit scaled to 8, as DALI does


DECODE = OpDef(
    "decode",
    "decode JPEG, PNG, GIF, TIFF, BMP, WebP bytes to HWC uint8 pixels (nvJPEG on GPU)",
    (Param("color", "str", "rgb", "output colour space", choices=("rgb", "gray")),),
    _decode_infer,
    dali=_decode_dali,
    pil=_decode_pil,
    devices=("cpu", "mixed"),
    dali_name="decoders.image",
    hw_effect="header",
    threaded=th.Threaded("decode"),
)


def _image_infer_sized(op: str):  # type: ignore[no-untyped-def]
    def infer(sig: Signature, p: dict[str, Any]) -> Signature:
        require(sig, kind=("image",), op=op)
        h, w = as_hw(p["size"])
        return sig.with_(shape=(h, w, sig.shape[2]))

    return infer


def _rrc_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    h, w = as_hw(p["size"])
    if ctx.fed:  # the window drawn as the other backends draw it (compile.dali_draws), of the decoded image
        crop = d.fn().slice(x, ctx.fed["anchor"], ctx.fed["shape"], device=ctx.device, axis_names="WH",
                            normalized_anchor=False, normalized_shape=False)
        return d.fn().resize(crop, device=ctx.device, size=[h, w], interp_type=d.interp(p["interpolation"]))
    return d.fn().random_resized_crop(
        x, device=ctx.device, size=[h, w], random_area=list(p["scale"]),
        random_aspect_ratio=list(p["ratio"]), interp_type=d.interp(p["interpolation"]),
    )


def _rrc_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    from feedfast.ops import pil_ops

    return pil_ops.random_resized_crop(
        img, p["size"], scale=tuple(p["scale"]), ratio=tuple(p["ratio"]), rng=rng,
        interpolation=pil_interp(p["interpolation"]),
    )


def _rrc_geometry(width: int, height: int, p: dict[str, Any], rng: Rng) -> th.Geometry:
    from feedfast.ops.pil_ops import random_resized_crop_params

    out_h, out_w = as_hw(p["size"])
    top, left, h, w = random_resized_crop_params(width, height, tuple(p["scale"]), tuple(p["ratio"]), rng)
    return th.Geometry((left, top, w, h), (out_w, out_h), pil_interp(p["interpolation"]))


def _rrc_row(p: dict[str, Any]) -> list[float] | None:
    (s0, s1), (r0, r1) = p["scale"], p["ratio"]
    if not (0 < s0 <= s1 and 0 < r0 <= r1):
        return None  # the Python walk raises the error that names the op
    h, w = as_hw(p["size"])
    return [th.PLAN_RRC, h, w, s0, s1, math.log(r0), math.log(r1), r0, r1, int(pil_interp(p["interpolation"]))]


def _rrc_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    positive_range("scale", p["scale"])
    positive_range("ratio", p["ratio"])
    return _image_infer_sized("random_resized_crop")(sig, p)


RANDOM_RESIZED_CROP = OpDef(
    "random_resized_crop",
    "crop a random area and aspect ratio, then resize (torchvision RandomResizedCrop)",
    (
        _SIZE,
        Param("scale", "range", (0.08, 1.0), "area of the crop as a fraction of the image", low=0, high=1),
        Param("ratio", "range", (3 / 4, 4 / 3), "aspect ratio (width/height) range", low=0, high=100),
        _INTERP,
    ),
    _rrc_infer,
    dali=_rrc_dali,
    pil=_rrc_pil,
    random=True,
    dali_name="random_resized_crop",
    hw_effect="size",
    threaded=th.Threaded("geometry", geometry=_rrc_geometry, resamples=True, plan_row=_rrc_row),
    dali_after_decode=DaliForm("decoders.image_random_crop+resize",
                               lambda ctx, decode_p, p, x: fused_decode_rrc_dali(ctx, decode_p, p, x)),
    dali_draws="window",
)


def _resize_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    require(sig, kind=("image",), op="resize")
    if isinstance(p["size"], int):
        return sig.with_(shape=(None, None, sig.shape[2]))
    h, w = as_hw(p["size"])
    return sig.with_(shape=(h, w, sig.shape[2]))


def _resize_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    kw: dict[str, Any] = {"interp_type": d.interp(p["interpolation"]), "antialias": True}
    if isinstance(p["size"], int):
        kw["resize_x"], kw["resize_y"] = d.shorter_side_sizes(ctx.in_hw, p["size"])
    else:
        h, w = as_hw(p["size"])
        kw.update(resize_x=float(w), resize_y=float(h))
    return d.fn().resize(x, device=ctx.device, **kw)


def _resize_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    from feedfast.ops import pil_ops

    if isinstance(p["size"], int):
        return pil_ops.resize_shorter(img, p["size"], pil_interp(p["interpolation"]))
    h, w = as_hw(p["size"])
    return img.resize((w, h), pil_interp(p["interpolation"]))


def _resize_geometry(width: int, height: int, p: dict[str, Any], rng: Rng) -> th.Geometry:
    if isinstance(p["size"], int):  # torchvision's Resize(int): the longer side truncated
        short, long = sorted((width, height))
        new = (p["size"], int(p["size"] * long / short))
        size = new if width <= height else (new[1], new[0])
    else:
        h, w = as_hw(p["size"])
        size = (w, h)
    return th.Geometry(None, size, pil_interp(p["interpolation"]))


def _resize_row(p: dict[str, Any]) -> list[float]:
    if isinstance(p["size"], int):
        return [th.PLAN_RESIZE_SHORT, p["size"], int(pil_interp(p["interpolation"]))]
    h, w = as_hw(p["size"])
    return [th.PLAN_RESIZE_HW, h, w, int(pil_interp(p["interpolation"]))]


RESIZE = OpDef(
    "resize",
    "resize: an integer resizes the shorter side keeping aspect ratio; [h, w] is exact",
    (Param("size", "size", 256, "shorter side, or [height, width]", low=1, high=16384), _INTERP),
    _resize_infer,
    dali=_resize_dali,
    pil=_resize_pil,
    dali_name="resize",
    hw_effect="resize",
    threaded=th.Threaded("geometry", geometry=_resize_geometry, resamples=True, plan_row=_resize_row),
)


def _center_crop_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    h, w = as_hw(p["size"])
    pos_x, pos_y = d.center_positions(ctx.in_hw, h, w)
    return d.fn().crop(x, device=ctx.device, crop=[float(h), float(w)], crop_pos_x=pos_x, crop_pos_y=pos_y,
                       out_of_bounds_policy="pad")


def _center_crop_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    from feedfast.ops import pil_ops

    return pil_ops.center_crop(img, p["size"])


def _center_crop_geometry(width: int, height: int, p: dict[str, Any], rng: Rng) -> th.Geometry | None:
    th_, tw = as_hw(p["size"])
    if th_ > height or tw > width:
        return None  # pads: the PIL program takes the sample
    return th.Geometry((int(round((width - tw) / 2.0)), int(round((height - th_) / 2.0)), tw, th_))


def _center_crop_row(p: dict[str, Any]) -> list[float]:
    h, w = as_hw(p["size"])
    return [th.PLAN_CENTER_CROP, h, w]


CENTER_CROP = OpDef(
    "center_crop",
    "crop the centre (zero padding when the image is smaller)",
    (_SIZE,),
    _image_infer_sized("center_crop"),
    dali=_center_crop_dali,
    pil=_center_crop_pil,
    dali_name="crop",
    hw_effect="size",
    threaded=th.Threaded("geometry", geometry=_center_crop_geometry, plan_row=_center_crop_row),
    folds=lambda p: True,
)


def _random_crop_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    h, w = as_hw(p["size"])
    return d.fn().crop(
        x, device=ctx.device, crop=[float(h), float(w)], out_of_bounds_policy="pad",
        crop_pos_x=d.uniform(0.0, 1.0), crop_pos_y=d.uniform(0.0, 1.0),
    )


def _random_crop_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    h, w = as_hw(p["size"])
    left = int(round(rng.random() * max(img.width - w, 0)))
    top = int(round(rng.random() * max(img.height - h, 0)))
    return img.crop((left, top, left + w, top + h))


def _random_crop_geometry(width: int, height: int, p: dict[str, Any], rng: Rng) -> th.Geometry | None:
    h, w = as_hw(p["size"])
    left = int(round(rng.random() * max(width - w, 0)))  # the draws of the PIL form, in its order
    top = int(round(rng.random() * max(height - h, 0)))
    if h > height or w > width:
        return None  # pads: the PIL program takes the sample
    return th.Geometry((left, top, w, h))


RANDOM_CROP = OpDef(
    "random_crop",
    "crop a window of fixed size at a random position (zero padding when too small)",
    (_SIZE,),
    _image_infer_sized("random_crop"),
    dali=_random_crop_dali,
    pil=_random_crop_pil,
    random=True,
    dali_name="crop",
    hw_effect="size",
    threaded=th.Threaded("geometry", geometry=_random_crop_geometry),
)


def _flip_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    if ctx.fed:  # the flags drawn as the other backends draw them (compile.dali_draws)
        return d.fn().flip(x, device=ctx.device, horizontal=ctx.fed["horizontal"], vertical=ctx.fed["vertical"])
    return d.fn().flip(x, device=ctx.device, horizontal=d.coin(p["horizontal"]), vertical=d.coin(p["vertical"]))


def _flip_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    from PIL import Image

    if rng.random() < p["horizontal"]:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if rng.random() < p["vertical"]:
        img = img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    return img


def _flips(p: dict[str, Any], rng: Rng) -> tuple[bool, bool]:
    return rng.random() < p["horizontal"], rng.random() < p["vertical"]


FLIP = OpDef(
    "flip",
    "flip horizontally and/or vertically, each with a probability",
    (
        Param("horizontal", "float", 0.5, "probability of a left-right flip", low=0, high=1),
        Param("vertical", "float", 0.0, "probability of a top-bottom flip", low=0, high=1),
    ),
    same_image("flip"),
    dali=_flip_dali,
    pil=_flip_pil,
    random=True,
    dali_name="flip",
    threaded=th.Threaded("flip", flips=_flips,
                         plan_row=lambda p: [th.PLAN_FLIP, float(p["horizontal"]), float(p["vertical"])]),
    folds=lambda p: p["vertical"] == 0.0,  # crop_mirror_normalize mirrors horizontally only
    dali_draws="flips",
)


def _rotate_dali(ctx: Any, p: dict[str, Any], x: Any) -> Any:
    lo, hi = p["angle"]
    return d.fn().rotate(
        x, device=ctx.device, angle=d.uniform(lo, hi), keep_size=True,
        fill_value=float(p["fill"]), interp_type=d.interp(p["interpolation"]),
    )


def _rotate_pil(img: Any, p: dict[str, Any], rng: Rng) -> Any:
    lo, hi = p["angle"]
    fill = int(p["fill"])
    return img.rotate(rng.uniform(lo, hi), resample=pil_interp(p["interpolation"]),
                      fillcolor=(fill,) * len(img.getbands()))


ROTATE = OpDef(
    "rotate",
    "rotate by a random angle in degrees (counter-clockwise), keeping the size",
    (
        Param("angle", "angle", (-10.0, 10.0), "degrees: a means [-a, a]; or [low, high]", low=-360, high=360),
        Param("fill", "float", 0.0, "value of the uncovered corners", low=0, high=255),
        _INTERP,
    ),
    same_image("rotate"),
    dali=_rotate_dali,
    pil=_rotate_pil,
    random=True,
    dali_name="rotate",
)


def pil_interp(name: str) -> Any:
    """The PIL resampling filter of a feedfast interpolation name."""
    from PIL import Image

    r = Image.Resampling
    return {"linear": r.BILINEAR, "cubic": r.BICUBIC, "nearest": r.NEAREST,
            "lanczos": r.LANCZOS, "triangular": r.BILINEAR}[name]


def fused_decode_rrc_dali(ctx: Any, decode_p: dict[str, Any], p: dict[str, Any], x: Any) -> Any:
    """Decode only a random region, then resize it: one ROI decode instead of a full one."""
    t = d.types()
    h, w = as_hw(p["size"])
    out = t.GRAY if decode_p["color"] == "gray" else t.RGB
    rdev = "gpu" if ctx.decoder_device == "mixed" else "cpu"
    if ctx.fed:  # the window drawn as the other backends draw it (compile.dali_draws): a region decode of it
        crop = d.fn().decoders.image_slice(
            x, ctx.fed["anchor"], ctx.fed["shape"], device=ctx.decoder_device, output_type=out, axis_names="WH",
            normalized_anchor=False, normalized_shape=False, **ctx.decoder_args,
        )
    else:
        crop = d.fn().decoders.image_random_crop(
            x, device=ctx.decoder_device, output_type=out, random_area=list(p["scale"]),
            random_aspect_ratio=list(p["ratio"]), num_attempts=10, **ctx.decoder_args,
        )
    return d.fn().resize(crop, device=rdev, size=[h, w], interp_type=d.interp(p["interpolation"]))


_pil_interp = pil_interp  # the former private name, for callers not yet moved
