"""The op registry and op definitions (see :mod:`feedfast.ops.registry`)."""

from feedfast.ops.base import OpDef, Param, Signature, SignatureError
from feedfast.ops.registry import OPS, get_op, suggest

__all__ = ["OPS", "OpDef", "Param", "Signature", "SignatureError", "get_op", "suggest"]
