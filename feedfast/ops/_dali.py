"""Small helpers shared by the DALI emitters (DALI is imported lazily)."""

from __future__ import annotations

from typing import Any

INTERPOLATIONS = ("linear", "cubic", "nearest", "lanczos", "triangular")


def fn() -> Any:
    """``nvidia.dali.fn``, imported on first use so feedfast imports without DALI."""
    from nvidia.dali import fn as dali_fn

    return dali_fn


def types() -> Any:
    """``nvidia.dali.types``."""
    from nvidia.dali import types as dali_types

    return dali_types


def interp(name: str) -> Any:
    """A DALI interpolation type from its feedfast name."""
    t = types()
    return {
        "linear": t.INTERP_LINEAR,
        "cubic": t.INTERP_CUBIC,
        "nearest": t.INTERP_NN,
        "lanczos": t.INTERP_LANCZOS3,
        "triangular": t.INTERP_TRIANGULAR,
    }[name]


def uniform(low: float, high: float) -> Any:
    """A per-sample uniform random value, or the constant when the range is empty."""
    if low == high:
        return float(low)
    return fn().random.uniform(range=[float(low), float(high)])


def coin(probability: float) -> Any:
    """A per-sample 0/1 draw, as a constant when the probability is 0 or 1."""
    if probability <= 0.0:
        return 0
    if probability >= 1.0:
        return 1
    return fn().random.coin_flip(probability=float(probability))


def dali_device(device: str) -> str:
    """DALI's ``device=`` for a node placed on ``device`` (decode's GPU form is ``mixed``)."""
    return "gpu" if device in ("gpu", "mixed") else "cpu"


def shorter_side_sizes(hw: tuple[Any, Any], size: int) -> tuple[Any, Any]:
    """Per-sample (width, height) resizing the shorter side to ``size``, torchvision's way.

    ``hw`` is the input's (height, width) as CPU nodes (see :mod:`feedfast.compile.shapes`).
    torchvision keeps the shorter side at ``size`` exactly and truncates the longer one
    (``int(size * long / short)``); DALI's ``resize_shorter`` rounds it instead, which
    shifts a later centre crop by a pixel on about half the images.
    """
    import nvidia.dali.math as dmath

    h, w = hw
    short = dmath.min(h, w)
    return dmath.floor(w * float(size) / short), dmath.floor(h * float(size) / short)


def center_positions(hw: tuple[Any, Any] | None, crop_h: int, crop_w: int) -> tuple[Any, Any]:
    """Per-sample ``crop_pos_x``/``crop_pos_y`` placing a centre crop where torchvision does.

    torchvision's offset is ``round((extent - crop) / 2)`` with Python's round-half-to-even;
    DALI rounds ``pos * (extent - crop)`` half away from zero. Giving DALI the exact offset
    as a fraction makes both agree. A crop larger than the image stays centred (padded).
    """
    if hw is None:  # the plan always tracks image sizes; None means a planner bug
        raise ValueError("centre crop needs the input's size")
    return _center_pos(hw[1], float(crop_w)), _center_pos(hw[0], float(crop_h))


def _center_pos(extent: Any, crop: float) -> Any:
    import nvidia.dali.math as dmath

    if isinstance(extent, float):
        slack_f = extent - crop
        return 0.5 if slack_f <= 0 else round(slack_f / 2.0) / slack_f
    slack = extent - crop
    half = slack * 0.5
    low = dmath.floor(half)
    frac = half - low
    is_odd_low = (low - dmath.floor(low * 0.5) * 2.0) > 0.5
    # round half to even: .5 goes up only when the lower neighbour is odd
    offset = low + (frac > 0.5) + (frac == 0.5) * is_odd_low
    return offset / dmath.max(slack, 1.0) * (slack > 0.0) + 0.5 * (slack <= 0.0)
