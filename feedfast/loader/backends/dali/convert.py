"""DALI outputs and host-op results to torch tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from feedfast.errors import BackendError, SampleError
from feedfast.ops.base import Rng
from feedfast.ops.generic import DecodeFailure
from feedfast.ops.registry import OPS
from feedfast.sources.members import StepBytes

try:
    from feedfast import _plan
except ImportError:  # not built at install: labels are parsed one at a time
    _plan = None


def tensorlist_to_torch(tl: Any, out: torch.Tensor, stream: Any = None) -> torch.Tensor:
    """Copy a DALI tensor, or a uniform TensorList (CPU or GPU), into ``out`` and return it.

    A CPU tensor is read through a NumPy view of DALI's buffer and copied by NumPy, in this
    thread, with the GIL released (DALI's ``copy_to_external`` holds it: 25 ms for a batch of
    64 float32 224 px images, during which the training thread could not run; torch's
    ``copy_`` splits a large copy over its OpenMP threads, which then spin against DALI's
    threads for the same cores: measured on 2 cores, the loader at 0.74 of a hand-written
    DALI pipeline with it, 0.91 without). A GPU tensor is copied by DALI, asynchronously, on
    ``stream``.
    """
    if hasattr(tl, "as_tensor"):
        tl = tl.as_tensor()
    if type(tl).__name__ == "TensorCPU":
        source = np.asarray(tl)
        if out.dtype == torch.bfloat16 or out.device.type != "cpu":  # no NumPy form: torch copies
            out.copy_(torch.from_numpy(source).view(out.shape))
        else:
            np.copyto(out.numpy(), source.reshape(tuple(out.shape)))
        return out
    from nvidia.dali.plugin.pytorch import feed_ndarray

    feed_ndarray(tl, out, cuda_stream=stream)
    return out


def dali_dtype_to_torch(tl: Any) -> torch.dtype:
    """The torch dtype matching a DALI TensorList's element type."""
    from nvidia.dali.plugin.pytorch import to_torch_type

    return to_torch_type[tl.dtype]


def raw_bytes(raw: Any, i: int) -> bytes:
    """Sample ``i`` of a raw (uint8) component as bytes: a feed's list of arrays or its
    :class:`~feedfast.sources.members.StepBytes`."""
    if isinstance(raw, StepBytes):
        return raw.member(i).tobytes()
    return np.asarray(raw[i]).tobytes()


def host_field(chain: list[Any], raw: Any, n: int, rng: Rng, where: list[tuple[str, str]], kind: str) -> Any:
    """A field made by host ops from ``n`` raw samples, collated. A lone ``label`` op over a feed's
    :class:`~feedfast.sources.members.StepBytes` parses the batch in one call of ``feedfast._plan``
    (the GIL released); a label it refuses goes through the op itself, which raises the op's own error."""
    if _plan is not None and isinstance(raw, StepBytes) and [node.op for node in chain] == ["label"]:
        labels = np.empty(n, dtype=np.int64)
        sizes = raw.sizes[:n]
        bad = _plan.parse_labels(raw.data, np.ascontiguousarray(raw.starts[:n]),
                                 np.ascontiguousarray(np.maximum(sizes, 0)), int(chain[0].params["offset"]), labels)
        if bad < 0 and (sizes >= 0).all():
            return torch.from_numpy(labels)
    return collate(run_host_ops(chain, raw, n, rng, where), kind)


def host_chain(plan_nodes: list[Any], node_id: int) -> tuple[str, list[Any]]:
    """The component a field's host ops read, and those ops in order (the chain ending at ``node_id``)."""
    chain = []
    nid = node_id
    while plan_nodes[nid].op != "read":
        chain.append(plan_nodes[nid])
        nid = plan_nodes[nid].inputs[0]
    chain.reverse()
    return str(plan_nodes[nid].params["component"]), chain


def run_host_ops(chain: list[Any], raw: Any, n: int, rng: Rng,
                 where: list[tuple[str, str]]) -> list[Any]:
    """Apply host ops (see :func:`host_chain`) to ``n`` raw samples."""
    values: list[Any] = []
    for i in range(n):
        v: Any = raw_bytes(raw, i)
        for node in chain:
            host_fn = OPS[node.op].pil
            if host_fn is None:
                raise BackendError(f"host op `{node.op}` ({node.key}) has no implementation")
            try:
                v = host_fn(v, node.params, rng)  # host ops share the portable form
            except DecodeFailure as exc:
                shard, key = where[i]
                raise SampleError(f"`{node.op}` failed ({node.key})", shard=shard, key=key, reason=str(exc)) from None
        values.append(v)
    return values


def collate(values: list[Any], kind: str) -> Any:
    """A batch of host values: int labels and same-shape arrays become tensors; others a list."""
    if kind == "label":
        return torch.tensor(values, dtype=torch.int64)
    if kind == "array" and values and all(isinstance(v, np.ndarray) for v in values):
        if len({v.shape for v in values}) == 1 and values[0].dtype != object:
            return torch.from_numpy(np.stack(values))
    return values
