"""The DALI backend: one rank's epoch through a DALI pipeline per epoch (CPU or GPU placement).

The pipeline of each epoch is built by :mod:`.dali_pipe`; a batch DALI fails is rescued by
:mod:`feedfast.loader.backends.dali.rescue` where the shards allow it (PIL reads the images DALI could not,
delivered re-encoded), or named by :mod:`feedfast.loader.backends.dali.diagnose`; a state's checkpoint is
checked against this spec's pipeline on load (:mod:`.dali_checkpoint`). Outputs leave DALI's
memory through the delivery stage, which this backend never sees.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator

import numpy as np
import torch

from feedfast.checks.validate import DEFAULT_MAX_PIXELS
from feedfast.compile.plan import Plan
from feedfast.loader.backends.base import Backend, BackendSettings
from feedfast.loader.backends.dali import convert, nativelog, rescue
from feedfast.loader.backends.dali.checkpoint import check_operators, pipeline_operators
from feedfast.loader.backends.dali.diagnose import diagnose
from feedfast.loader.backends.dali.pipe import CHECKPOINT_EVERY, EpochPipe, make_pipeline, release_memory
from feedfast.loader.backends.dali.stream import StreamEpoch, epoch_stream
from feedfast.loader.batch import Batch
from feedfast.order.deal import EpochPlan
from feedfast.order.rows import epoch_rows
from feedfast.sources.dataset import ShardSet


class DaliBackend(Backend):
    """A DALI pipeline per epoch; the next epoch's is built and started while this one drains.

    On a GPU (a GPU-placed plan) DALI's memory pools are kept across epochs: nvJPEG's pools are
    not grown again each epoch; :meth:`close` gives them back. DALI's checkpoint is taken after
    every ``settings.checkpoint_every`` steps (``Batch.checkpoint``).
    """

    name = "dali"
    checkpoints = True

    def reads_rows(self, partition: str, transport: str) -> bool:
        """DALI's reader reads a local rank range itself; feedfast's feed (a shuffled or streamed epoch) reads rows."""
        return partition != "shards" or transport != "native"

    def __init__(self, settings: BackendSettings) -> None:
        super().__init__(settings)
        s = settings
        self.plan, self.shards_for, self.plan_for = s.plan, s.shards_for, s.plan_for
        self.rank, self.world, self.batch_size, self.threads = s.rank, s.world, s.batch_size, s.threads
        self.device_id, self.seed, self.prefetch = s.device_id, s.seed, s.prefetch
        self.keep_pools = s.plan.placement == "gpu"
        self.max_pixels, self.checkpoint_every = s.max_pixels, s.checkpoint_every
        self.patches = rescue.Patches()  # images DALI rejected and PIL decoded, re-encoded (kept across epochs)
        self.capture: nativelog.Capture | None = None  # DALI's native log lines to logging while pipelines live
        self.pipe: EpochPipe | None = None  # the open epoch's pipeline
        self.ahead: EpochPipe | None = None  # the next epoch's, started early

    def batches(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None) -> Iterator[Batch]:
        """The epoch's batches, each with DALI's checkpoint after it; a failed batch is rescued
        (:mod:`~feedfast.loader.backends.dali.rescue`) when the shards allow it."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and (ahead.epoch, start, checkpoint) == (epoch, 0, None) and not ahead.lost_shards:
            self.pipe = ahead  # (one that lost a shard while prepared is built again: the epoch asks its source again)
        else:
            self._drop(ahead)
            self.pipe = self._build(epoch, ep, start, checkpoint)
        try:
            rng = random.Random(f"{self.seed}/{epoch}/{self.rank}/{start}")
            shards = self.shards_for(epoch)
            recover = partial(self._recover, epoch, ep) if rescue.rescuable(shards) else None
            suspects = partial(self._suspects, epoch, ep, self.pipe.depth)
            yield from run_epoch(self.pipe, self.plan, ep, rng, shards, max_pixels=self.max_pixels,
                                 suspects=suspects, recover=recover, every=self.checkpoint_every)
        finally:  # the delivery stage finished its copies out of DALI's buffers before it asked again
            pipe, self.pipe = self.pipe, None
            self._drop(pipe)

    def _recover(self, epoch: int, ep: EpochPlan, step: int, exc: RuntimeError) -> EpochPipe:
        """After DALI failed ``step``: rescue the images that broke it and go on from ``step`` in a new pipeline.

        Raises:
            SampleError: an image of the steps in flight that neither DALI nor PIL decodes, or (no image
                being to blame on the CPU) the sample DALI's message names.
            FeedfastError: nothing names a sample.
        """
        failed = self.pipe
        assert failed is not None
        stream = failed.omap.stream or self._stream(epoch, ep)
        seconds = self.plan.spec.check_seconds
        steps = range(step, min(ep.steps, step + failed.depth + 1))
        try:
            found = rescue.examine(stream, steps, rescue.image_components(self.plan), self.patches,
                                   max_pixels=self.max_pixels, seconds=seconds)
        finally:
            if stream is not failed.omap.stream:
                stream.feeder.close()
        if not found:  # a GPU decoder or another operator failed: named from DALI's message where it can be
            suspects = None if failed.omap.stream else self._suspects(epoch, ep, failed.depth, step)
            raise diagnose(exc, self.plan, step, self.shards_for(epoch), failed.omap.stream,
                           max_pixels=self.max_pixels, candidates=suspects) from exc
        for where in found:
            rescue.log.info("shard %r, sample %r: %s", where[0], where[1], self.patches.reasons[where])
        self._drop(failed)
        ahead, self.ahead = self.ahead, None  # built without these images: rebuilt with them when needed
        self._drop(ahead)
        self.pipe = self._build(epoch, ep, step, None, first_step=step)
        return self.pipe

    def rescued(self) -> list[tuple[str, str, str]]:
        """(shard, key, reason) of every image rescued so far: delivered as PNG in place (see :mod:`.rescue`)."""
        return [(shard, key, reason) for (shard, key), reason in self.patches.reasons.items()]

    def _stream(self, epoch: int, ep: EpochPlan) -> StreamEpoch:
        return epoch_stream(self.plan, self.shards_for(epoch), ep, rank=self.rank, world=self.world,
                                   batch_size=self.batch_size, seed=self.seed, epoch=epoch)

    def _suspects(self, epoch: int, ep: EpochPlan, depth: int, step: int) -> list[tuple[str, str]]:
        """(shard, key) of the samples DALI's native reader holds for steps ``step`` .. ``step + depth``.

        Its order is the rank's contiguous range (no shuffle: a shuffled epoch goes through the
        feed, which names its samples); a shuffle buffer would widen it, so the buffer is added.
        """
        shards = self.shards_for(epoch)
        rows = epoch_rows(shards, self.plan.component_exts(), ep, rank=self.rank, world=self.world, seed=self.seed,
                          epoch=epoch, shuffle=False)
        lo = max(0, step * self.batch_size - self.plan.spec.shuffle_buffer)
        hi = min(len(rows), (step + depth + 1) * self.batch_size + self.plan.spec.shuffle_buffer)
        where = rows.take(np.arange(lo, hi))
        return [(shards.paths[s], k) for s, k in zip(where.shard.tolist(), rows.index.batch_keys(where))]

    def _build(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None,
               first_step: int = 0) -> EpochPipe:
        """The epoch's pipeline from ``start``; a checkpoint taken after a rescue rebuilds that rescue."""
        if self.capture is None or not self.capture.held:
            self.capture = nativelog.Capture()
        checkpoint, saved_first, keys = rescue.unwrap_checkpoint(checkpoint)
        if keys:
            first_step = saved_first
            stream = self._stream(epoch, ep)
            try:
                rescue.rescue_keys(stream, keys, rescue.image_components(self.plan), self.patches,
                                   max_pixels=self.max_pixels, seconds=self.plan.spec.check_seconds)
            finally:
                stream.feeder.close()
        return make_pipeline(
            self.plan, self.shards_for(epoch), ep, rank=self.rank, world=self.world, batch_size=self.batch_size,
            threads=self.threads, device_id=self.device_id, seed=self.seed, epoch=epoch,
            prefetch=self.prefetch, checkpoint=checkpoint, start=start,
            patches=self.patches if self.patches else None, first_step=first_step,
        )

    def all_in_flight(self) -> bool:
        """Whether every step of the open epoch has been handed to DALI."""
        return self.pipe is not None and self.pipe.all_scheduled

    def prepare(self, epoch: int) -> None:
        """Build the next epoch's pipeline and start it while this epoch's last batches finish.

        Training loops iterate epoch after epoch, so the next epoch's first batches are
        decoded while the current epoch drains instead of after it. If the next iteration
        asks for another epoch (``set_epoch``) or never comes, the prepared pipeline is
        dropped; the cost is at most ``prefetch_factor`` batches of decoding.
        """
        if self.ahead is not None and self.ahead.epoch == epoch:
            return
        self._drop(self.ahead)
        self.ahead = None
        ahead = self._build(epoch, self.plan_for(epoch), 0, None)
        ahead.prefetch()
        self.ahead = ahead

    def check_checkpoint(self, checkpoint: str, epoch: int) -> None:
        """Refuse a checkpoint whose operators are not this spec's pipeline's (a one-line UserError naming
        ``dali.checkpoint``): DALI would otherwise fail, or restore the wrong operators, mid-epoch."""
        inner, _, keys = rescue.unwrap_checkpoint(checkpoint)
        shards, ep = self.shards_for(epoch), self.plan_for(epoch)
        fed = bool(keys) or bool(self.patches) or shards.transport == "stream" or ep.partition == "global"
        check_operators(inner or "", pipeline_operators(self.plan, shards, fed=fed, batch_size=self.batch_size))

    def _drop(self, ep_pipe: EpochPipe | None) -> None:
        if ep_pipe is not None:
            pipe, ep_pipe.pipe = ep_pipe.pipe, None
            release_memory(pipe, pools=not self.keep_pools)

    def close(self) -> None:
        """Drop the prepared pipeline, give back DALI's pooled memory, stop capturing DALI's log lines."""
        ahead, self.ahead = self.ahead, None
        self._drop(ahead)
        if self.keep_pools:
            release_memory(None)
        if self.capture is not None:
            self.capture.release()


def run_epoch(ep_pipe: EpochPipe, plan: Plan, ep: EpochPlan, rng: random.Random,
              shards: ShardSet, *, max_pixels: int = DEFAULT_MAX_PIXELS,
              suspects: Callable[[int], list[tuple[str, str]]] | None = None,
              recover: Callable[[int, RuntimeError], EpochPipe] | None = None,
              every: int = CHECKPOINT_EVERY) -> Iterator[Batch]:
    """Yield this rank's batches of the epoch from the pipe's start step on (run on the producer thread).

    Each batch's DALI outputs are :class:`DaliOutput` objects, copied out of DALI's memory by
    the delivery stage (:mod:`feedfast.loader.deliver`); host ops (labels, keys) run here. When
    DALI fails a step, ``recover(step, error)`` gives the pipeline that goes on from that step (it raises
    when it cannot: see :mod:`feedfast.loader.backends.dali.rescue`); without it, the failure is raised,
    ``suspects(step)`` (the samples of the steps in flight) narrowing
    :func:`~feedfast.loader.backends.dali.diagnose.diagnose`'s search for the sample to name.

    DALI's checkpoint is taken after every ``every``-th step of the epoch (``Batch.checkpoint``;
    None after the others): 1 when each batch carries its state.
    """
    step = ep_pipe.start
    while step < ep.steps:
        omap = ep_pipe.omap
        try:
            outs = ep_pipe.next()
        except RuntimeError as exc:
            if recover is None:
                candidates = suspects(step) if suspects is not None and omap.stream is None else None
                raise diagnose(exc, plan, step, shards, omap.stream, max_pixels=max_pixels,
                               candidates=candidates) from exc
            ep_pipe = recover(step, exc)
            continue
        checkpoint = ep_pipe.checkpoint() if (step + 1) % every == 0 else None
        size = ep.batch_sizes[step]
        raw_at = len(omap.fields)
        where = omap.stream.origins(step, size) if omap.stream else convert.origins(outs[raw_at], size)
        lost = omap.stream.lost(step) if omap.stream else None  # under skip: rows of a shard unreadable mid-epoch
        valid, skipped = lost if lost is not None else (ep.valid[step], ())
        fields = _fields(outs, omap, plan, size, rng, where, step)
        step += 1
        yield Batch(fields, where, valid, checkpoint, lost=skipped)


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


def _fields(outs: Any, omap: Any, plan: Plan, size: int, rng: random.Random,
            where: list[tuple[str, str]], step: int) -> dict[str, Any]:
    """One batch's fields: DALI's outputs as they are (the delivery stage copies them), host ops run on the raw
    component DALI returned, or (behind a feed) on the members the feed kept for them."""
    fields: dict[str, Any] = {name: DaliOutput.of(outs[i], size) for i, name in enumerate(omap.fields)}
    for name, nid in plan.outputs.items():
        if plan.nodes[nid].device == "host":
            comp, chain = convert.host_chain(plan.nodes, nid)
            c = plan.components.index(comp)
            raw = omap.stream.host(step, c) if omap.stream is not None else outs[len(omap.fields) + c]
            fields[name] = convert.host_field(chain, raw, size, rng, where, plan.nodes[nid].sig.kind)
    return fields
