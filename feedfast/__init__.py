"""feedfast: keep the GPU fed. Declarative DALI pipelines over WebDataset shards."""

from feedfast.errors import BackendError, FeedfastError, SampleError, ShardError, SpecError, UserError
from feedfast.loader import DataLoader
from feedfast.loader.batch import BatchInfo
from feedfast.ops.mixup import Mixup
from feedfast.sources.mix import Mix
from feedfast.spec import Spec, load_spec

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name == "StallMeter":
        from feedfast.meter import StallMeter

        return StallMeter
    raise AttributeError(f"module 'feedfast' has no attribute {name!r}")


__all__ = [
    "BackendError", "BatchInfo", "DataLoader", "FeedfastError", "Mix", "Mixup", "SampleError", "ShardError", "Spec",
    "SpecError", "StallMeter", "UserError", "load_spec",
]
