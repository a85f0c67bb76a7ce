"""feedfast: keep the GPU fed. Declarative DALI pipelines over WebDataset shards."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from feedfast.errors import BackendError, FeedfastError, SampleError, ShardError, SpecError, UserError
from feedfast.sources.mixture import Mix
from feedfast.spec import Spec, load_spec

if TYPE_CHECKING:
    from feedfast.loader import DataLoader
    from feedfast.loader.batch import BatchInfo
    from feedfast.meter import StallMeter
    from feedfast.ops.mixup import Mixup

__version__ = "0.1.0"

_LAZY = {"DataLoader": "feedfast.loader", "BatchInfo": "feedfast.loader.batch", "Mixup": "feedfast.ops.mixup",
         "StallMeter": "feedfast.meter"}
"""Names imported when first used: each needs torch (2 s to import), which ``feedfast shards`` and
``feedfast --help`` do not (``feedfast plan`` and ``bench`` do: they build loaders)."""


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'feedfast' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups find it without this hook
    return value


__all__ = [
    "BackendError", "BatchInfo", "DataLoader", "FeedfastError", "Mix", "Mixup", "SampleError", "ShardError", "Spec",
    "SpecError", "StallMeter", "UserError", "load_spec",
]
