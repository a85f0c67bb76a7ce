"""The DALI backend: one rank's epochs through DALI (CPU or GPU placement).

Every epoch is read by feedfast's feed (local shards, remote ones, images in place, rescued images) and runs
through one pipeline built for the loader's life (:mod:`.life`): DALI's own reader is not used, so the order,
the crops and flips, and the pipeline are the same over every kind of shard. A batch DALI fails is rescued by
:mod:`feedfast.loader.backends.dali.rescue` where the shards allow it (PIL reads the images DALI could not,
delivered re-encoded), or named by :mod:`feedfast.loader.backends.dali.diagnose`; a state's checkpoint is
checked against this spec's pipeline on load (:mod:`.checkpoint`). Outputs leave DALI's
memory through the delivery stage, which this backend never sees.
"""

from __future__ import annotations

import random
from typing import Any, Iterator

from feedfast.compile.build import build_plan
from feedfast.compile.dali_draws import draws_all_fed
from feedfast.errors import UserError
from feedfast.loader.backends.base import Backend, BackendSettings
from feedfast.loader.backends.dali import nativelog, rescue
from feedfast.loader.backends.dali.checkpoint import check_operators, pipeline_operators
from feedfast.loader.backends.dali.life import LifePipe, StepQueue, run_life_epoch
from feedfast.loader.backends.dali.pipe import epoch_seed, make_life, release_memory
from feedfast.loader.backends.dali.stream import StreamEpoch, epoch_stream
from feedfast.loader.batch import Batch
from feedfast.order.deal import EpochPlan
from feedfast.sources.dataset import ShardSet
from feedfast.sources.mixture import Dataset

GPU_DEPTH = 3
"""DALI's queue on a GPU at least: the producer thread's work between two batches (the host ops, the checkpoint,
the copy's events) must not leave the GPU waiting."""


class DaliBackend(Backend):
    """One DALI pipeline for the loader's life behind feedfast's feed, rebuilt only by a rescue or a restored state.

    On a GPU (a GPU-placed plan) DALI's queue is at least :data:`GPU_DEPTH` deep and its memory pools are kept
    across pipelines; :meth:`close` gives them back. DALI's checkpoint is taken after every
    ``settings.checkpoint_every`` steps (``Batch.checkpoint``), and after an epoch's last step behind the feed,
    whose pipeline runs on into the next epoch.
    """

    name = "dali"
    checkpoints = True
    sources = frozenset({"shards", "folder"})  # a folder read in place through the feed (dataset.members)
    skips_as_read = False  # DALI fails a batch with a file it cannot decode: rescued or named, never skipped

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
        self.life: LifePipe | None = None  # the pipeline behind the feed, for the loader's life
        self.segment: int | None = None  # the open epoch's steps in the life pipeline's queue
        self.depth = max(self.prefetch, GPU_DEPTH) if s.plan.placement == "gpu" else max(1, self.prefetch)

    def batches(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None) -> Iterator[Batch]:
        """The epoch's batches through the life pipeline, each with DALI's checkpoint after it: the prepared steps
        of this epoch where they match, else its steps queued now; the pipeline built first when there is none or
        a state's checkpoint is restored. A failed batch is rescued where the shards allow it, and the pipeline
        built again at its step; else it is named (:func:`~feedfast.loader.backends.dali.rescue.in_flight`)."""
        rng = random.Random(f"{self.seed}/{epoch}/{self.rank}/{start}")
        life, step, first_step, rebuild = self.life, start, 0, checkpoint is not None
        while True:
            if life is None or rebuild:
                life = self._build_life(epoch, ep, step, checkpoint, first_step=first_step)
            segment = self.segment = life.segment_for(epoch, ep, step)
            try:
                for batch in run_life_epoch(life, segment, self.plan, ep, rng, step, every=self.checkpoint_every):
                    step += 1
                    yield batch
                break
            except RuntimeError as exc:
                in_flight = range(step, min(ep.steps, step + life.depth + 1))  # the failed step and those after it
                rescue.in_flight(exc, life.queue.segments[segment].stream, in_flight, self.plan, self.patches,
                                 self.shards_for(epoch), max_pixels=self.max_pixels)
                rebuild, checkpoint, first_step = True, None, step  # on from the failed step, the images rescued
        life.queue.retire(segment)
        self.segment = None

    def rescued(self) -> list[tuple[str, str, str]]:
        """(shard, key, reason) of every image rescued so far: delivered as PNG in place (see :mod:`.rescue`)."""
        return [(shard, key, reason) for (shard, key), reason in self.patches.reasons.items()]

    def _stream(self, epoch: int, ep: EpochPlan, **feed: Any) -> StreamEpoch:
        return epoch_stream(self.plan, self.shards_for(epoch), ep, rank=self.rank, world=self.world,
                            batch_size=self.batch_size, seed=self.seed, epoch=epoch,
                            workers=max(2, self.threads), ahead=max(2, self.threads) + self.depth, **feed)

    def _capture(self) -> None:
        if self.capture is None or not self.capture.held:
            self.capture = nativelog.Capture()

    def _build_life(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None,
                    first_step: int = 0) -> LifePipe:
        """The pipeline for the loader's life, from ``epoch``'s step ``start``, in place of the one there was: restored
        from a state's checkpoint (a rescue it holds rescued again), or new (seeded for ``epoch``; after a rescue,
        started at ``first_step``)."""
        self._drop_life()
        self._capture()
        dali, saved_first, keys = rescue.unwrap_checkpoint(checkpoint)
        iteration = rescue.wrapped_iteration(checkpoint)
        if checkpoint is not None and iteration is None:  # a pipeline per epoch's: it numbered from first_step
            iteration = start - saved_first
        if keys:
            first_step = saved_first
            stream = self._stream(epoch, ep)
            try:
                rescue.rescue_keys(stream, keys, rescue.image_components(self.plan), self.patches,
                                   max_pixels=self.max_pixels, seconds=self.plan.spec.check_seconds)
            finally:
                stream.feeder.close()
        queue = StepQueue(self.patches if self.patches else None, holds=self.depth + 1)
        pipe, omap = make_life(self.plan, queue, batch_size=self.batch_size, threads=self.threads,
                               device_id=self.device_id, seed=epoch_seed(self.seed, epoch, self.rank),
                               depth=self.depth, checkpoint=dali)
        rescued = tuple(sorted(self.patches.images)) if self.patches else ()
        self.life = LifePipe(pipe, omap, queue, self.depth, self._stream, self.plan_for, taken=iteration or 0,
                             first_step=first_step, rescued=rescued)
        return self.life

    def all_in_flight(self) -> bool:
        """Whether every step of the open epoch has been handed to DALI."""
        return self.segment is not None and self.life is not None and self.life.all_scheduled(self.segment)

    def prepare(self, epoch: int) -> None:
        """Start the next epoch while this epoch's last batches finish.

        Its steps are queued to the life pipeline, which runs them as this epoch's last ones are taken
        (their reads start ahead too: the step queue's prefetch). Training loops iterate
        epoch after epoch, so the next epoch's first batches are decoded while the current epoch drains
        instead of after it. If the next iteration asks for another epoch (``set_epoch``) or never comes,
        what was started is dropped; the cost is at most DALI's queue of batches.
        """
        if self.life is not None:
            self.life.prepare(epoch)

    def runs_on(self, checkpoint: str | None) -> bool:
        """A life pipeline's checkpoint (it says the DALI iteration it resumes at) runs on into the next epoch."""
        return rescue.wrapped_iteration(checkpoint) is not None

    def check_checkpoint(self, checkpoint: str, epoch: int) -> bool:
        """Refuse a checkpoint whose operators are not this spec's pipeline's (a one-line UserError naming
        ``dali.checkpoint``): DALI would otherwise fail, or restore the wrong operators, mid-epoch.

        Returns:
            False where the checkpoint is this spec's pipeline at another placement, for another consumer (a
            GPU-placed state on a CPU-placed loader delivering to cuda, whose cheap transfer ends the graph
            otherwise) or behind DALI's reader (an unshuffled s3/gs epoch's, before every epoch was fed), and this
            pipeline is fed every draw it makes (:func:`~feedfast.compile.dali_draws.draws_all_fed`): its batches
            are then a function of the step alone, and the checkpoint is set aside. True: it is restored.
        """
        inner, _, keys = rescue.unwrap_checkpoint(checkpoint)
        shards = self.shards_for(epoch)
        try:
            check_operators(inner or "", pipeline_operators(self.plan, shards, fed=True, batch_size=self.batch_size))
        except UserError:
            if keys or not draws_all_fed(self.plan) or not self._another_graph(inner or "", shards):
                raise
            rescue.log.info("this state's DALI checkpoint is of this spec's pipeline at another placement, for "
                            "another consumer or behind DALI's reader; every draw of this one is fed as data, so it "
                            "resumes from the step")
            return False
        return True

    def _another_graph(self, checkpoint: str, shards: Dataset) -> bool:
        """Whether ``checkpoint`` is of this spec's pipeline placed on the CPU or the GPU, for either consumer, fed or
        (over shards) behind DALI's reader."""
        readers = (True, False) if isinstance(shards, ShardSet) else (True,)
        for device, consumer in (("gpu", "cuda"), ("gpu", "cpu"), ("cpu", "cuda"), ("cpu", "cpu")):
            plan = build_plan(self.plan.spec, device=device, consumer=consumer)
            for fed in readers:
                try:
                    check_operators(checkpoint, pipeline_operators(plan, shards, fed=fed, batch_size=self.batch_size))
                    return True
                except UserError:
                    continue
        return False

    def _drop_life(self) -> None:
        life, self.life, self.segment = self.life, None, None
        if life is not None:
            life.queue.close()
            pipe, life.pipe = life.pipe, None
            release_memory(pipe, pools=not self.keep_pools)

    def close(self) -> None:
        """Drop the pipelines, give back DALI's pooled memory, stop capturing DALI's log lines."""
        self._drop_life()
        if self.keep_pools:
            release_memory(None)
        if self.capture is not None:
            self.capture.release()
