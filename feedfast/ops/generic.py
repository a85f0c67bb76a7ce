"""Generic ops on raw component bytes; they run on the host after the DALI graph.

Each host emitter maps one sample's bytes (a ``bytes`` object) to a Python value; the
loader collates a batch of them (tensors are stacked, other values are kept as lists).
"""

from __future__ import annotations

import io
import json
from typing import Any

from feedfast.ops.base import OpDef, Param, Rng, Signature, SignatureError, require

_RAW = ("bytes", "encoded")


class DecodeFailure(ValueError):
    """A host op could not read one sample's bytes (the loader adds shard and key)."""


def _label_infer(sig: Signature, p: dict[str, Any]) -> Signature:
    require(sig, kind=_RAW, op="label")
    return Signature("label", (), "int64", "", "host")


def _label_host(raw: bytes, p: dict[str, Any], rng: Rng) -> int:
    text = raw.decode("ascii", errors="replace").strip()
    try:
        return int(text) - p["offset"]
    except ValueError:
        raise DecodeFailure(f"label is not an integer: {raw[:40]!r}") from None


LABEL = OpDef(
    "label",
    "ASCII decimal class index (WebDataset `.cls`) to int64",
    (Param("offset", "int", 0, "subtracted from every label (1 for 1-based labels)", low=-(2**31), high=2**31),),
    _label_infer,
    pil=_label_host,
    devices=("cpu",),
    host=True,
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
        return arr if p["dtype"] == "keep" else arr.astype(p["dtype"])
    except Exception as exc:  # noqa: BLE001 - hostile headers raise many classes (MemoryError, TypeError, ...)
        raise DecodeFailure(f"not a valid .npy array: {type(exc).__name__}: {str(exc)[:120]}") from None


NPY = OpDef(
    "npy",
    "decode a NumPy .npy array (no pickles); same-shape arrays are stacked into a tensor",
    (Param("dtype", "str", "keep", "cast to this type", choices=_NP_TYPES),),
    _npy_infer,
    pil=_npy_host,
    devices=("cpu",),
    host=True,
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
