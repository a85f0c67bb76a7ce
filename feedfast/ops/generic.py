"""Generic ops on raw component bytes; they run on the host after the DALI graph.

Each host emitter maps one sample's bytes (a ``bytes`` object) to a Python value; the
loader collates a batch of them (tensors are stacked, other values are kept as lists).
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

from feedfast.ops.base import OpDef, Param, Rng, Signature, SignatureError, require

_RAW = ("bytes", "encoded")


class DecodeFailure(ValueError):
    """A host op could not read one sample's bytes (the loader adds shard and key)."""


def _label_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    require(sig, kind=_RAW, op="label")
    return Signature("label", (), "int64", "", "host")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_PLAIN_INT = re.compile(rb"[ \t\r\n]*([+-]?)0*([0-9]+)[ \t\r\n]*\Z")


def _label_host(raw: bytes, p: dict[str, Any], rng: Rng) -> int:
    """A plain ASCII decimal integer, ASCII whitespace around it allowed; its value less ``offset`` within int64.

    ``42.0``, ``0x2a``, ``4_2``, a BOM, a NUL, non-ASCII digits and an empty label are refused
    (``int()`` alone would take ``4_2`` and overflow later, in the collate).
    """
    found = _PLAIN_INT.match(bytes(raw))
    if found is None:
        raise DecodeFailure(f"label is not a plain integer: {bytes(raw[:40])!r}")
    sign, digits = found.groups()
    value = int(sign + digits) - p["offset"] if len(digits) <= 19 else None  # 19 digits: int64's longest
    if value is None or not INT64_MIN <= value <= INT64_MAX:
        shifted = f" less offset {p['offset']}" if p["offset"] else ""
        raise DecodeFailure(f"label{shifted} is outside int64: {bytes(raw[:40])!r}")
    return value


LABEL = OpDef(
    "label",
    "ASCII decimal class index (WebDataset `.cls`) to int64; anything else (`42.0`, `0x2a`, empty, past int64) "
    "is a bad sample under `on_error`",
    (Param("offset", "int", 0, "subtracted from every label (1 for 1-based labels)", low=-(2**31), high=2**31),),
    _label_infer,
    pil=_label_host,
    devices=("cpu",),
    host=True,
    refuses=True,
    dali_name="(host) int",
)


def _json_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    require(sig, kind=_RAW, op="json")
    return Signature("json", (), "object", "", "host")


def _json_host(raw: bytes, p: dict[str, Any], rng: Rng) -> Any:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: hostile nesting ([[[[...)
        raise DecodeFailure(f"not valid JSON: {type(exc).__name__}: {str(exc)[:120]}") from None
    if p["field"]:
        if not isinstance(value, dict) or p["field"] not in value:
            raise DecodeFailure(f"JSON has no field {p['field']!r}")
        value = value[p["field"]]
    return value


JSON = OpDef(
    "json",
    "parse JSON; the batch holds a list of Python values",
    (Param("field", "str", "", "take only this top-level field (empty: the whole value)"),),
    _json_infer,
    pil=_json_host,
    devices=("cpu",),
    host=True,
    refuses=True,
    dali_name="(host) json.loads",
)

_NP_TYPES = ("keep", "float32", "float16", "int64", "int32", "uint8")


def _npy_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    require(sig, kind=_RAW, op="npy")
    if p["dtype"] not in _NP_TYPES:
        raise SignatureError(f"`dtype` must be one of {_NP_TYPES}")
    return Signature("array", (), "any" if p["dtype"] == "keep" else p["dtype"], "", "host")


def _npy_host(raw: bytes, p: dict[str, Any], rng: Rng) -> Any:
    import numpy as np

    try:
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - hostile headers raise many classes (MemoryError, TypeError, ...)
        raise DecodeFailure(f"not a valid .npy array: {type(exc).__name__}: {str(exc)[:120]}") from None
    return arr if p["dtype"] == "keep" else _cast(arr, np.dtype(p["dtype"]))


def _cast(arr: Any, dtype: Any) -> Any:
    """``arr`` as ``dtype``; to an integer type only when every value fits (NaN, inf and values out of
    range would wrap silently), from a non-numeric array never."""
    import numpy as np

    if arr.dtype.kind not in "biuf":
        raise DecodeFailure(f"a .npy array of {arr.dtype} cannot be cast to {dtype}")
    if dtype.kind in "iu" and arr.dtype.kind in "iuf" and arr.size:
        info = np.iinfo(dtype)
        low, high = arr.min(), arr.max()
        # from floats the top bound is max + 1 (a power of two, exact): float(2**63 - 1) rounds to 2**63
        fits = low >= info.min and (high <= info.max if arr.dtype.kind != "f" else high < float(info.max) + 1)
        if not (np.isfinite(low) and np.isfinite(high) and fits):
            raise DecodeFailure(f"a .npy array with values from {low} to {high} does not fit {dtype}")
    return arr.astype(dtype)


NPY = OpDef(
    "npy",
    "decode a NumPy .npy array (no pickles); same-shape arrays are stacked into a tensor",
    (Param("dtype", "str", "keep", "cast to this type (to an integer type only if every value fits)",
           choices=_NP_TYPES),),
    _npy_infer,
    pil=_npy_host,
    devices=("cpu",),
    host=True,
    refuses=True,
    dali_name="(host) numpy.load",
)


def _bytes_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    require(sig, kind=_RAW, op="bytes")
    return Signature("bytes", (None,), "object", "", "host")


BYTES = OpDef(
    "bytes",
    "the component's raw bytes; the batch holds a list of `bytes`",
    (),
    _bytes_infer,
    pil=lambda raw, p, rng: bytes(raw),
    devices=("cpu",),
    host=True,
    dali_name="(host) bytes",
)
