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
from feedfast.sources.stream import StreamEpoch
from feedfast.sources.validate import DEFAULT_MAX_PIXELS

_FAILED = re.compile(r"Failed to decode sample #(\d+) : ([^\n|]*)")


@dataclass
class Batch:
    """One batch before it is shaped as the spec's outputs."""

    fields: dict[str, Any]
    origins: list[tuple[str, str]]
    valid: int


def make_pipeline(plan: Plan, shards: ShardSet, ep: EpochPlan, *, rank: int, world: int, batch_size: int,
                  threads: int, device_id: int | None, seed: int, epoch: int, prefetch: int,
                  checkpoint: str | None, start: int = 0) -> EpochPipe:
    """Build the epoch's DALI pipeline: shards in the epoch's order, this rank's range."""
    spec = plan.spec
    reader = ReaderConfig(
        paths=[shards.paths[i] for i in ep.shard_order],
        index_paths=[shards.index_paths[i] for i in ep.shard_order],
        shard_id=rank, num_shards=world, shuffle_buffer=spec.shuffle_buffer,
        missing=spec.missing, stick_to_shard=True, seed=_epoch_seed(seed, epoch, rank),
    )
    if shards.transport == "stream":
        _stream_source(reader, plan, shards, ep, rank=rank, world=world, batch_size=batch_size, seed=seed,
                       epoch=epoch, workers=threads, prefetch=prefetch)
    remaining = ep.steps - start
    depth = max(1, min(prefetch, remaining))
    pipe, omap = build_pipeline(
        plan, reader, batch_size=batch_size, num_threads=threads, device_id=device_id,
        seed=_epoch_seed(seed, epoch, rank), prefetch_queue_depth=depth, checkpoint=checkpoint,
    )
    try:
        pipe.build()
    except RuntimeError as exc:
        raise BackendError(f"DALI could not build the pipeline for {spec.file}: {_first_line(exc)}") from exc
    return EpochPipe(pipe, omap, epoch, start, remaining, depth)


def _stream_source(reader: ReaderConfig, plan: Plan, shards: ShardSet, ep: EpochPlan, *, rank: int, world: int,
                   batch_size: int, seed: int, epoch: int, workers: int, prefetch: int) -> None:
    """Feed the pipeline from feedfast's stream transport (:mod:`feedfast.sources.stream`)."""
    exts = [{e.lower() for e in plan.nodes[i].params["ext"].split(";")} for i in range(len(plan.components))]
    stream = StreamEpoch(shards, ep, exts, rank=rank, world=world, batch_size=batch_size,
                         shuffle_window=plan.spec.shuffle_buffer, seed=seed, epoch=epoch,
                         workers=max(2, workers), ahead=max(2, workers) + prefetch)
    reader.feed, reader.stream = stream.feeder, stream


def release_memory(pipe: Any = None) -> None:
    """Destroy a pipeline now and give back what it held: DALI's pools and free heap pages.

    A pipeline is built per epoch. DALI's Python ``Pipeline`` sits in reference cycles, so
    it would be freed only by the cyclic GC (a full collection costs 0.2 to 0.4 s here);
    shutting its backend down directly (``Pipeline._shutdown``, what its ``__del__`` calls)
    frees the C++ side at once. Without the release, pooled and fragmented heap memory
    grows resident size by a few hundred MB over the first epochs before levelling off.
    """
    shutdown = getattr(pipe, "_shutdown", None)
    if callable(shutdown):
        shutdown()
    elif pipe is not None:
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


def diagnose(exc: RuntimeError, plan: Plan, step: int, shards: ShardSet, stream: Any = None) -> FeedfastError:
    """Turn a DALI failure into an error naming the shard and sample where possible.

    The reader's ``source_info`` names the sample. An external source has none: the
    stream transport (``stream``) names the sample by its number in the batch, or reads
    the step's images again and probes them.
    """
    from feedfast.loader.convert import sample_origin
    from feedfast.sources.checked import find_bad_image

    text = str(exc)
    hint = "set on_error='skip' (spec `source: {on_error: skip}`) to leave undecodable samples out"
    m = _FAILED.search(text)
    if m and m.group(2).strip():
        shard, key = sample_origin(m.group(2).strip())
        return SampleError("DALI could not decode a sample", shard=shard, key=key, reason=f"{_first_line(exc)}; {hint}")
    if m and stream is not None:
        shard, key = stream.origins(step, int(m.group(1)) + 1)[-1]
        return SampleError("DALI could not decode a sample", shard=shard, key=key, reason=f"{_first_line(exc)}; {hint}")
    exts = [{e.lower() for e in c.ext.split(";")} for c in plan.spec.components.values() if c.kind == "image"]
    if stream is not None:
        found = stream.bad_sample(step, exts, DEFAULT_MAX_PIXELS) if exts else None
    else:
        found = find_bad_image(list(shards.paths), list(shards.index_paths), exts, DEFAULT_MAX_PIXELS) if exts else None
    if found:
        return SampleError("DALI could not decode a sample", shard=found[0], key=found[1], reason=f"{found[2]}; {hint}")
    return FeedfastError(f"DALI pipeline failed at epoch step {step}: {_first_line(exc)}")


@dataclass
class EpochPipe:
    """A DALI pipeline bound to one epoch and driven for exactly its remaining steps.

    ``Pipeline.run()`` schedules one iteration past every batch it returns, so a pipeline
    per epoch would decode ``prefetch`` batches nobody reads. Scheduling by hand stops at
    the epoch's last step; :meth:`prefetch` starts the work early (the loader calls it on
    the next epoch's pipeline while the current one drains).
    """

    pipe: Any
    omap: Any
    epoch: int
    start: int
    remaining: int
    depth: int
    scheduled: int = 0

    def prefetch(self) -> None:
        """Start computing the first batches, without waiting for them."""
        if self.scheduled == 0 and self.remaining > 0:
            self.pipe.schedule_run()  # DALI's first call queues ``depth`` iterations
            self.scheduled = self.depth

    def next(self) -> Any:
        """The next batch's outputs, keeping ``depth`` iterations in flight within the epoch."""
        if self.scheduled == 0:
            self.prefetch()
        elif self.scheduled < self.remaining:
            self.pipe.schedule_run()
            self.scheduled += 1
        return self.pipe.outputs()

    @property
    def all_scheduled(self) -> bool:
        """Whether every step of the epoch has been handed to DALI."""
        return self.scheduled >= self.remaining


def run_epoch(ep_pipe: EpochPipe, plan: Plan, ep: EpochPlan, ring: PinnedRing, rng: random.Random,
              shards: ShardSet) -> Iterator[Batch]:
    """Yield this rank's batches of the epoch from the pipe's start step on."""
    omap = ep_pipe.omap
    raw_at = len(omap.fields)
    for step in range(ep_pipe.start, ep.steps):
        try:
            outs = ep_pipe.next()
        except RuntimeError as exc:
            raise diagnose(exc, plan, step, shards, omap.stream) from exc
        size, valid = ep.batch_sizes[step], ep.valid[step]
        where = omap.stream.origins(step, size) if omap.stream else convert.origins(outs[raw_at], size)
        yield Batch(_fields(outs, omap, plan, size, ring, rng, where), where, valid)


def _fields(outs: Any, omap: Any, plan: Plan, size: int, ring: PinnedRing, rng: random.Random,
            where: list[tuple[str, str]]) -> dict[str, Any]:
    slot = ring.slot()
    host: dict[str, torch.Tensor] = {}
    device: dict[str, torch.Tensor] = {}
    for i, name in enumerate(omap.fields):
        tl = outs[i]
        dense = tl.as_tensor()  # one contiguous tensor: the spec declares fixed-size fields
        shape, dtype = tuple(dense.shape()), convert.dali_dtype_to_torch(tl)
        if type(tl).__name__ == "TensorListGPU":
            out = torch.empty(shape, dtype=dtype, device=ring.device)
            device[name] = convert.tensorlist_to_torch(dense, out, torch.cuda.current_stream(ring.device))[:size]
        else:
            host[name] = convert.tensorlist_to_torch(dense, ring.staging(slot, name, shape, dtype))[:size]
    result: dict[str, Any] = {**ring.upload(slot, host), **device}
    for name, params in omap.deferred.items():
        result[name] = normalize_tensor(result[name], params)
    for name, nid in plan.outputs.items():
        if plan.nodes[nid].device == "host":
            comp, chain = convert.host_chain(plan.nodes, nid)
            raw = outs[len(omap.fields) + plan.components.index(comp)]
            values = convert.run_host_ops(chain, raw, size, rng, where)
            result[name] = convert.collate(values, plan.nodes[nid].sig.kind)
            if isinstance(result[name], torch.Tensor) and ring.device.type != "cpu":
                result[name] = result[name].to(ring.device, non_blocking=True)
    return result
