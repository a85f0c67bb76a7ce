"""One epoch of one rank through a DALI pipeline, as batches of torch tensors."""

from __future__ import annotations

import random
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from feedfast.compile.dali import ReaderConfig, build_pipeline
from feedfast.compile.plan import Plan
from feedfast.errors import BackendError, FeedfastError, SampleError
from feedfast.loader import convert
from feedfast.loader.prefetch import PinnedRing
from feedfast.ops.color import normalize_tensor
from feedfast.sources.assign import EpochPlan
from feedfast.sources.dataset import ShardSet
from feedfast.sources.validate import DEFAULT_MAX_PIXELS

_FAILED = re.compile(r"Failed to decode sample #\d+ : ([^\n|]+)")


@dataclass
class Batch:
    """One batch before it is shaped as the spec's outputs."""

    fields: dict[str, Any]
    origins: list[tuple[str, str]]
    valid: int


def make_pipeline(plan: Plan, shards: ShardSet, ep: EpochPlan, *, rank: int, world: int, batch_size: int,
                  threads: int, device_id: int | None, seed: int, epoch: int, prefetch: int,
                  checkpoint: str | None) -> tuple[Any, Any]:
    """Build the epoch's DALI pipeline: shards in the epoch's order, this rank's range."""
    spec = plan.spec
    reader = ReaderConfig(
        paths=[shards.paths[i] for i in ep.shard_order],
        index_paths=[shards.index_paths[i] for i in ep.shard_order],
        shard_id=rank, num_shards=world, shuffle_buffer=spec.shuffle_buffer,
        missing=spec.missing, stick_to_shard=True,
    )
    pipe, omap = build_pipeline(
        plan, reader, batch_size=batch_size, num_threads=threads, device_id=device_id,
        seed=_epoch_seed(seed, epoch, rank), prefetch_queue_depth=prefetch, checkpoint=checkpoint,
    )
    try:
        pipe.build()
    except RuntimeError as exc:
        raise BackendError(f"DALI could not build the pipeline for {spec.file}: {_first_line(exc)}") from exc
    return pipe, omap


def release_memory() -> None:
    """Give back what a destroyed pipeline held: DALI's memory pools and the C heap's free pages.

    A pipeline is built per epoch; without this, pooled and fragmented heap memory grows
    resident size by a few hundred MB over the first epochs before it levels off.
    """
    import gc

    gc.collect()
    try:
        from nvidia.dali import backend

        backend.ReleaseUnusedMemory()
    except (ImportError, AttributeError, RuntimeError) as exc:
        warnings.warn(f"could not release DALI's unused memory: {exc}", stacklevel=2)
    _malloc_trim()


def _malloc_trim() -> None:
    """glibc's ``malloc_trim(0)``: return free heap pages to the OS (Linux/glibc only)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):
        return  # not glibc (musl has no malloc_trim): nothing to trim


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 7919 + rank * 104_729) % (2**31 - 1)


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return next((ln for ln in lines if "Error" in ln or "error" in ln), lines[0] if lines else repr(exc))


def diagnose(exc: RuntimeError, plan: Plan, step: int, shards: ShardSet) -> FeedfastError:
    """Turn a DALI failure into an error naming the shard and sample where possible."""
    from feedfast.loader.convert import sample_origin
    from feedfast.sources.checked import find_bad_image

    text = str(exc)
    hint = "set on_error='skip' (spec `source: {on_error: skip}`) to leave undecodable samples out"
    m = _FAILED.search(text)
    if m:
        shard, key = sample_origin(m.group(1).strip())
        return SampleError("DALI could not decode a sample", shard=shard, key=key, reason=f"{_first_line(exc)}; {hint}")
    exts = [{e.lower() for e in c.ext.split(";")} for c in plan.spec.components.values() if c.kind == "image"]
    found = find_bad_image(list(shards.paths), list(shards.index_paths), exts, DEFAULT_MAX_PIXELS) if exts else None
    if found:
        return SampleError("DALI could not decode a sample", shard=found[0], key=found[1], reason=f"{found[2]}; {hint}")
    return FeedfastError(f"DALI pipeline failed at epoch step {step}: {_first_line(exc)}")


def run_epoch(pipe: Any, omap: Any, plan: Plan, ep: EpochPlan, start: int, ring: PinnedRing,
              rng: random.Random, shards: ShardSet) -> Iterator[Batch]:
    """Yield this rank's batches of the epoch from step ``start`` on."""
    raw_at = len(omap.fields)
    for step in range(start, ep.steps):
        try:
            outs = pipe.run()
        except RuntimeError as exc:
            raise diagnose(exc, plan, step, shards) from exc
        size, valid = ep.batch_sizes[step], ep.valid[step]
        where = convert.origins(outs[raw_at], size)
        yield Batch(_fields(outs, omap, plan, size, ring, rng, where), where, valid)


def _fields(outs: Any, omap: Any, plan: Plan, size: int, ring: PinnedRing, rng: random.Random,
            where: list[tuple[str, str]]) -> dict[str, Any]:
    slot = ring.slot()
    host: dict[str, torch.Tensor] = {}
    device: dict[str, torch.Tensor] = {}
    for i, name in enumerate(omap.fields):
        tl = outs[i]
        shape = tuple(tl.as_tensor().shape()) if hasattr(tl, "as_tensor") else tuple(tl.shape())
        dtype = convert.dali_dtype_to_torch(tl)
        if type(tl).__name__ == "TensorListGPU":
            out = torch.empty(shape, dtype=dtype, device=ring.device)
            device[name] = convert.tensorlist_to_torch(tl, out, torch.cuda.current_stream(ring.device))[:size]
        else:
            host[name] = convert.tensorlist_to_torch(tl, ring.staging(slot, name, shape, dtype))[:size]
    result: dict[str, Any] = {**ring.upload(slot, host), **device}
    for name, params in omap.deferred.items():
        result[name] = normalize_tensor(result[name], params)
    for name, nid in plan.outputs.items():
        if plan.nodes[nid].device == "host":
            comp = _component_of(plan, nid)
            raw = outs[len(omap.fields) + plan.components.index(comp)]
            values = convert.run_host_ops(plan.nodes, nid, raw, size, rng, where)
            result[name] = convert.collate(values, plan.nodes[nid].sig.kind)
            if isinstance(result[name], torch.Tensor) and ring.device.type != "cpu":
                result[name] = result[name].to(ring.device, non_blocking=True)
    return result


def _component_of(plan: Plan, nid: int) -> str:
    while plan.nodes[nid].op != "read":
        nid = plan.nodes[nid].inputs[0]
    return str(plan.nodes[nid].params["component"])
