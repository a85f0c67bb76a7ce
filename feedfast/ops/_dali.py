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
