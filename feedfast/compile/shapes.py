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

HW = tuple[Any, Any]  # (height, width): floats, or CPU DataNodes of one float per sample

_FIXED_SIZE = ("random_resized_crop", "decode+random_resized_crop", "center_crop", "random_crop")


def encoded_hw(raw: Any) -> HW:
    """(height, width) of encoded images, read from their headers on the CPU."""
    shape = d.fn().peek_image_shape(raw, dtype=d.types().FLOAT)
    return shape[0], shape[1]


def out_hw(n: Node, in_hw: HW | None, raw: Any | None) -> HW | None:
    """The node's output (height, width), or None after a layout change."""
    if n.op == "decode":
        return encoded_hw(raw)
    for op in _FIXED_SIZE:
        if n.op == op or n.op.startswith(op + "+"):
            key = "random_resized_crop" if "random_resized_crop" in n.op else op
            params = n.params.get(key, n.params)
            return tuple(float(v) for v in as_hw(params["size"]))  # type: ignore[return-value]
    if n.op == "resize":
        if isinstance(n.params["size"], int):
            if in_hw is None:
                raise BackendError(f"`resize` ({n.key}) needs its input's size, which the plan lost")
            w, h = d.shorter_side_sizes(in_hw, n.params["size"])
            return h, w
        return tuple(float(v) for v in as_hw(n.params["size"]))  # type: ignore[return-value]
    if "normalize" in n.op:
        return None
    return in_hw
