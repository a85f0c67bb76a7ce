"""Per-sample image sizes, tracked on the CPU alongside the DALI graph.

Resize and centre crop need each sample's height and width to follow torchvision's
rounding (see :mod:`feedfast.ops._dali`). ``fn.shapes`` of GPU data lives on the GPU, where
DALI cannot read it as an argument, so feedfast follows sizes on the CPU instead: from the
encoded bytes (``fn.peek_image_shape``, no decode) through each op's known effect.
"""

from __future__ import annotations

from typing import Any

from feedfast.compile.plan import Node
from feedfast.errors import BackendError
from feedfast.ops import _dali as d
from feedfast.ops.base import as_hw
from feedfast.ops.registry import OPS

HW = tuple[Any, Any]  # (height, width): floats, or CPU DataNodes of one float per sample


def encoded_hw(raw: Any) -> HW:
    """(height, width) of encoded images, read from their headers on the CPU."""
    shape = d.fn().peek_image_shape(raw, dtype=d.types().FLOAT)
    return shape[0], shape[1]


def out_hw(n: Node, in_hw: HW | None, raw: Any | None) -> HW | None:
    """The node's output (height, width), or None after a layout change.

    Each op declares its effect (``OpDef.hw_effect``); a fused node (``decode+random_resized_crop``)
    applies its ops' effects in order, each with its own parameters.
    """
    parts = n.op.split("+")
    hw = in_hw
    for op in parts:
        params = n.params[op] if len(parts) > 1 else n.params
        hw = _effect(op, params, hw, raw, n.key)
    return hw


def _effect(op: str, params: dict[str, Any], hw: HW | None, raw: Any | None, key: str) -> HW | None:
    effect = OPS[op].hw_effect
    if effect == "header":
        return encoded_hw(raw)
    if effect == "layout":
        return None
    if effect == "size" or (effect == "resize" and not isinstance(params["size"], int)):
        return tuple(float(v) for v in as_hw(params["size"]))  # type: ignore[return-value]
    if effect == "resize":
        if hw is None:
            raise BackendError(f"`{op}` ({key}) needs its input's size, which the plan lost")
        w, h = d.shorter_side_sizes(hw, params["size"])
        return h, w
    return hw
