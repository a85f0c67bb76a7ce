"""A DALI iteration's outputs as one batch's fields: DALI's tensors left in its memory for the delivery stage to
copy out, and the host ops (labels, keys) run on the raw components."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

import torch

from feedfast.compile.plan import Plan
from feedfast.loader.backends.dali import convert


@dataclass(frozen=True)
class DaliOutput:
    """One output of a DALI iteration, still in DALI's memory (a :class:`~feedfast.loader.batch.Pending`)."""

    dense: Any  # a contiguous TensorCPU or TensorGPU: the spec declares fixed-size fields
    rows: int  # the batch's rows (a partial last batch is cut from a full-size output)
    shape: tuple[int, ...]
    dtype: torch.dtype
    on_device: bool

    @classmethod
    def of(cls, tensor_list: Any, rows: int) -> "DaliOutput":
        """A TensorList (CPU or GPU) of ``rows`` samples."""
        dense = tensor_list.as_tensor()
        return cls(dense, rows, tuple(dense.shape()), convert.dali_dtype_to_torch(tensor_list),
                   type(dense).__name__ == "TensorGPU")

    def write(self, out: torch.Tensor, stream: Any) -> torch.Tensor:
        """Copy into ``out`` (from the GPU: queued on ``stream``); the batch's rows of it."""
        return convert.tensorlist_to_torch(self.dense, out, stream)[: self.rows]

    def to_host(self) -> "DaliOutput":
        """The output copied to host memory (placement gpu, device cpu: asked for, warned about at construction)."""
        return DaliOutput.of(self.dense.as_cpu(), self.rows)


def batch_fields(outs: Any, omap: Any, plan: Plan, size: int, rng: random.Random,
                 where: Any, raw: Callable[[int], Any]) -> dict[str, Any]:
    """One batch's fields: DALI's outputs as they are (the delivery stage copies them), host ops run on a raw
    component (``raw(c)``: the members the feed kept for them)."""
    fields: dict[str, Any] = {name: DaliOutput.of(outs[i], size) for i, name in enumerate(omap.fields)}
    for name, nid in plan.outputs.items():
        if plan.nodes[nid].device == "host":
            comp, chain = convert.host_chain(plan.nodes, nid)
            values = raw(plan.components.index(comp))
            fields[name] = convert.host_field(chain, values, size, rng, where, plan.nodes[nid].sig.kind)
    return fields
