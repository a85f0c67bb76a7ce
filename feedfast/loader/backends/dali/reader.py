"""The epochs DALI's own reader reads: an unshuffled epoch of s3/gs shards, which DALI's clients open (every other
epoch goes through feedfast's feed and the life pipeline, :mod:`.life`).

Each such epoch runs through a pipeline of its own (:func:`~feedfast.loader.backends.dali.pipe.make_pipeline`),
driven for exactly its steps and released; the next epoch's is built and started while this one drains. A batch
DALI fails is handed to the backend's ``recover`` (which rescues the images to blame, or raises what names the
sample), and the epoch then goes on from that step behind the feed (:class:`Refeed`).
"""

from __future__ import annotations

import random
from functools import partial
from typing import Callable, Iterator

import numpy as np

from feedfast.checks.validate import DEFAULT_MAX_PIXELS
from feedfast.compile.plan import Plan
from feedfast.loader.backends.base import BackendSettings
from feedfast.loader.backends.dali import convert
from feedfast.loader.backends.dali.diagnose import diagnose
from feedfast.loader.backends.dali.outputs import batch_fields, raw_output
from feedfast.loader.backends.dali.pipe import CHECKPOINT_EVERY, EpochPipe, make_pipeline, release_memory
from feedfast.loader.batch import Batch
from feedfast.order.deal import EpochPlan
from feedfast.order.rows import epoch_rows
from feedfast.sources.dataset import ShardSet

Recover = Callable[[int, int, RuntimeError], None]
"""``(step, depth, error)``: rescue the images of the steps a failed pipeline had in flight, or raise."""


class Refeed(Exception):
    """Images DALI's reader pipeline failed on were rescued: the epoch goes on from ``step`` behind the feed."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.step = step


class ReaderEpochs:
    """Epochs behind DALI's reader: the open epoch's pipeline (:attr:`pipe`) and the next one's, started early
    (:attr:`ahead`). ``capture``: called before a pipeline is built (DALI's native log to ``logging``)."""

    def __init__(self, settings: BackendSettings, capture: Callable[[], None]) -> None:
        self.s, self.capture = settings, capture
        self.keep_pools = settings.plan.placement == "gpu"
        self.pipe: EpochPipe | None = None
        self.ahead: EpochPipe | None = None

    def batches(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None,
                recover: Recover | None) -> Iterator[Batch]:
        """The epoch's batches from ``start``, through the pipeline started ahead for it or a new one.

        Raises:
            Refeed: a failed batch's images were rescued (``recover`` returned): the rest goes behind the feed.
        """
        ahead, self.ahead = self.ahead, None
        if ahead is not None and (ahead.epoch, start, checkpoint) == (epoch, 0, None):
            self.pipe = ahead
        else:
            self.drop(ahead)
            self.pipe = self.build(epoch, ep, start, checkpoint)
        try:
            rng = random.Random(f"{self.s.seed}/{epoch}/{self.s.rank}/{start}")
            depth = self.pipe.depth
            suspects = lambda step: self.suspects(epoch, ep, depth, step)  # noqa: E731
            yield from run_epoch(self.pipe, self.s.plan, ep, rng, self._shards(epoch),
                                 max_pixels=self.s.max_pixels, suspects=suspects,
                                 recover=_refeeding(recover, depth) if recover is not None else None,
                                 every=self.s.checkpoint_every)
        finally:  # the delivery stage finished its copies out of DALI's buffers before it asked again
            pipe, self.pipe = self.pipe, None
            self.drop(pipe)

    def prepare(self, epoch: int, ep: EpochPlan) -> None:
        """Build and start ``epoch``'s pipeline while the open one drains."""
        if self.ahead is not None and self.ahead.epoch == epoch:
            return
        self.drop_ahead()
        ahead = self.build(epoch, ep, 0, None)
        ahead.prefetch()
        self.ahead = ahead

    def build(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None) -> EpochPipe:
        """The epoch's pipeline behind DALI's reader, from ``start``."""
        self.capture()
        s = self.s
        return make_pipeline(s.plan, self._shards(epoch), ep, rank=s.rank, world=s.world, batch_size=s.batch_size,
                             threads=s.threads, device_id=s.device_id, seed=s.seed, epoch=epoch,
                             prefetch=s.prefetch, checkpoint=checkpoint, start=start)

    def suspects(self, epoch: int, ep: EpochPlan, depth: int, step: int) -> list[tuple[str, str]]:
        """(shard, key) of the samples DALI's native reader holds for steps ``step`` .. ``step + depth``.

        Its order is the rank's contiguous range (no shuffle: a shuffled epoch goes through the
        feed, which names its samples); a shuffle buffer would widen it, so the buffer is added.
        """
        s, shards = self.s, self.s.shards_for(epoch)
        rows = epoch_rows(shards, s.plan.component_exts(), ep, rank=s.rank, world=s.world, seed=s.seed, epoch=epoch,
                          shuffle=False)
        lo = max(0, step * s.batch_size - s.plan.spec.shuffle_buffer)
        hi = min(len(rows), (step + depth + 1) * s.batch_size + s.plan.spec.shuffle_buffer)
        where = rows.take(np.arange(lo, hi))
        return [(shards.paths[i], k) for i, k in zip(where.shard.tolist(), rows.index.batch_keys(where))]

    def _shards(self, epoch: int) -> ShardSet:
        """The epoch's shards: DALI's reader reads tars only (images in place always go through the feed)."""
        shards = self.s.shards_for(epoch)
        assert isinstance(shards, ShardSet), "DALI's reader reads shards only: images in place are fed"
        return shards

    @property
    def all_scheduled(self) -> bool:
        """Whether every step of the open epoch has been handed to DALI."""
        return self.pipe is not None and self.pipe.all_scheduled

    def drop(self, ep_pipe: EpochPipe | None) -> None:
        """Release a pipeline now (its pools kept on a GPU, for the next one)."""
        if ep_pipe is not None:
            pipe, ep_pipe.pipe = ep_pipe.pipe, None
            release_memory(pipe, pools=not self.keep_pools)

    def drop_ahead(self) -> None:
        """Release the pipeline started for the next epoch, if any."""
        ahead, self.ahead = self.ahead, None
        self.drop(ahead)


def _refeeding(recover: Recover, depth: int) -> Callable[[int, RuntimeError], EpochPipe]:
    def refeed(step: int, exc: RuntimeError) -> EpochPipe:
        recover(step, depth, exc)
        raise Refeed(step)

    return refeed


def run_epoch(ep_pipe: EpochPipe, plan: Plan, ep: EpochPlan, rng: random.Random,
              shards: ShardSet, *, max_pixels: int = DEFAULT_MAX_PIXELS,
              suspects: Callable[[int], list[tuple[str, str]]] | None = None,
              recover: Callable[[int, RuntimeError], EpochPipe] | None = None,
              every: int = CHECKPOINT_EVERY) -> Iterator[Batch]:
    """Yield this rank's batches of the epoch from the pipe's start step on (run on the producer thread).

    Each batch's DALI outputs are :class:`~feedfast.loader.backends.dali.outputs.DaliOutput` objects, copied out of
    DALI's memory by the delivery stage (:mod:`feedfast.loader.deliver`); host ops (labels, keys) run here. When
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
        fields = batch_fields(outs, omap, plan, size, rng, where, partial(raw_output, outs, raw_at))
        step += 1
        yield Batch(fields, where, valid, checkpoint, lost=skipped)
