"""The backends behind one small interface: an epoch source makes one rank's batches of an epoch.

=========  ==========================================================  ==========================
backend    what makes the batches                                      resumes from
=========  ==========================================================  ==========================
dali       a DALI pipeline per epoch (CPU or GPU placement); local,    DALI's checkpoint
           s3/gs (DALI's reader) and http/pipe (the stream transport)
threads    pillow-simd in threads, reduced-size JPEG decode, one       the step (per-sample RNG)
           crop-and-resize call per image (:mod:`.thread_epoch`)
pil        the PIL program in torch DataLoader worker processes        the step (per-sample RNG)
=========  ==========================================================  ==========================

``threads`` and ``pil`` give the same samples, crops and flips for a (seed, epoch, rank);
``dali`` gives the same samples per epoch and rank but its own order within its shuffle buffer
and its own augmentation draws. ``threads`` and ``pil`` read local shards with ``pread`` and
every other kind (http, s3, gs, the shard cache) by range, ahead of decoding
(:mod:`feedfast.sources.rangeread`). :func:`choose_backend` picks by what runs the spec
fastest, not by where its bytes live: ``threads`` for a CPU-placed plan whose ops it runs,
local or remote shards alike, else ``dali``.

Every source's :meth:`EpochSource.batches` runs on the loader's producer thread
(:mod:`feedfast.loader.ahead`); a batch whose ``ready`` is None holds host tensors that the
loader then copies through the pinned ring.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from functools import partial
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from feedfast.compile.plan import Plan
from feedfast.errors import UserError
from feedfast.loader import nativelog, rescue
from feedfast.loader.diagnose import diagnose
from feedfast.loader.epoch import CHECKPOINT_EVERY, Batch, EpochPipe, make_pipeline, release_memory, run_epoch
from feedfast.loader.knobs import Knobs
from feedfast.loader.prefetch import PinnedRing
from feedfast.sources import rangeread
from feedfast.sources.assign import EpochPlan
from feedfast.sources.dataset import ShardSet
from feedfast.sources.rows import epoch_rows
from feedfast.sources.stream import StreamEpoch
from feedfast.sources.validate import DEFAULT_MAX_PIXELS
from feedfast.spec.runtime import BACKENDS

log = logging.getLogger("feedfast")


class EpochSource(Protocol):
    """One backend: the batches of one rank's epoch from a step on, and what it holds between epochs."""

    name: str

    def batches(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None) -> Iterator[Batch]:
        """Batches of ``epoch`` from step ``start``; ``checkpoint`` is a state this source wrote in a Batch."""
        ...

    def prepare(self, epoch: int) -> None:
        """Start ``epoch``'s first batches now, ahead of its iteration (dropped if another epoch comes next)."""
        ...

    def close(self) -> None:
        """Release what the source holds between epochs (threads, pipelines, pooled memory)."""
        ...


class DaliSource:
    """A DALI pipeline per epoch; the next epoch's is built and started while this one drains.

    Args:
        plan: the compiled plan (its placement decides CPU or GPU operators).
        shards_for: the dataset of an epoch (a :class:`~feedfast.Mix` draws one per epoch).
        ring: the pinned ring that moves outputs to the consumer's device.
        device_id: DALI's GPU, or None for a CPU pipeline.
        keep_pools: keep DALI's memory pools across epochs (on a GPU: nvJPEG's pools are not rebuilt).
        checkpoint_every: take DALI's checkpoint after every this many steps (``Batch.checkpoint``).
    """

    name = "dali"

    def __init__(self, plan: Plan, shards_for: Callable[[int], ShardSet], ring: PinnedRing, *, rank: int, world: int,
                 batch_size: int, threads: int, device_id: int | None, seed: int, prefetch: int,
                 plan_for: Callable[[int], EpochPlan], keep_pools: bool, max_pixels: int = DEFAULT_MAX_PIXELS,
                 checkpoint_every: int = CHECKPOINT_EVERY) -> None:
        self.plan, self.shards_for, self.ring, self.plan_for = plan, shards_for, ring, plan_for
        self.rank, self.world, self.batch_size, self.threads = rank, world, batch_size, threads
        self.device_id, self.seed, self.prefetch, self.keep_pools = device_id, seed, prefetch, keep_pools
        self.max_pixels, self.checkpoint_every = max_pixels, checkpoint_every
        self.patches = rescue.Patches()  # images DALI rejected and PIL decoded, re-encoded (kept across epochs)
        self.capture: nativelog.Capture | None = None  # DALI's native log lines to logging while pipelines live
        self.pipe: EpochPipe | None = None  # the open epoch's pipeline
        self.ahead: EpochPipe | None = None  # the next epoch's, started early

    def batches(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None) -> Iterator[Batch]:
        """The epoch's batches, each with DALI's checkpoint after it; a failed batch is rescued
        (:mod:`~feedfast.loader.rescue`) when the shards allow it."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and (ahead.epoch, start, checkpoint) == (epoch, 0, None):
            self.pipe = ahead
        else:
            self._drop(ahead)
            self.pipe = self._build(epoch, ep, start, checkpoint)
        try:
            rng = random.Random(f"{self.seed}/{epoch}/{self.rank}/{start}")
            shards = self.shards_for(epoch)
            recover = partial(self._recover, epoch, ep) if rescue.rescuable(shards) else None
            suspects = partial(self._suspects, epoch, ep, self.pipe.depth)
            for batch in run_epoch(self.pipe, self.plan, ep, self.ring, rng, shards, max_pixels=self.max_pixels,
                                   suspects=suspects, recover=recover, every=self.checkpoint_every):
                yield batch  # handed over first: the consumer need not wait out the next epoch's build
                if self.pipe.all_scheduled and self.ahead is None:
                    self._prepare(epoch + 1)
        finally:
            self.ring.drain()  # the side stream may still read DALI's buffers
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
        self.ring.drain()
        self._drop(failed)
        ahead, self.ahead = self.ahead, None  # built without these images: rebuilt with them when needed
        self._drop(ahead)
        self.pipe = self._build(epoch, ep, step, None, first_step=step)
        return self.pipe

    def rescued(self) -> list[tuple[str, str, str]]:
        """(shard, key, reason) of every image rescued so far: delivered as PNG in place (see :mod:`.rescue`)."""
        return [(shard, key, reason) for (shard, key), reason in self.patches.reasons.items()]

    def _stream(self, epoch: int, ep: EpochPlan) -> StreamEpoch:
        return rescue.epoch_stream(self.plan, self.shards_for(epoch), ep, rank=self.rank, world=self.world,
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

    def _prepare(self, epoch: int) -> None:
        """Build the next epoch's pipeline and start it while this epoch's last batches finish.

        Training loops iterate epoch after epoch, so the next epoch's first batches are
        decoded while the current epoch drains instead of after it. If the next iteration
        asks for another epoch (``set_epoch``) or never comes, the prepared pipeline is
        dropped; the cost is at most ``prefetch_factor`` batches of decoding.
        """
        ahead = self._build(epoch, self.plan_for(epoch), 0, None)
        ahead.prefetch()
        self.ahead = ahead

    def prepare(self, epoch: int) -> None:
        """Build and start ``epoch``'s pipeline unless it already is (the loader calls it at an epoch's end)."""
        if self.ahead is None or self.ahead.epoch != epoch:
            self._drop(self.ahead)
            self.ahead = None
            self._prepare(epoch)

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


class ProgramSource:
    """A PIL program per sample: in threads (``threads``) or in DataLoader worker processes (``pil``).

    Args:
        name: the backend's name.
        run: :func:`~feedfast.loader.thread_epoch.run_thread_epoch` or
            :func:`~feedfast.loader.pil_epoch.run_pil_epoch` (one signature).
        knobs: read live by ``run`` (the threaded path's threads and batches in flight); None:
            ``workers`` and ``prefetch`` are fixed per epoch.
        start_ahead: whether :meth:`prepare` starts the next epoch on a thread while this one drains.
    """

    def __init__(self, name: str, run: Callable[..., Iterator[Batch]], plan: Plan,
                 shards_for: Callable[[int], ShardSet], *, rank: int, world: int, batch_size: int, workers: int,
                 seed: int, prefetch: int, plan_for: Callable[[int], EpochPlan], knobs: Knobs | None = None,
                 start_ahead: bool = False) -> None:
        self.name, self.run, self.plan, self.shards_for, self.plan_for = name, run, plan, shards_for, plan_for
        self.rank, self.world, self.batch_size = rank, world, batch_size
        self.workers, self.seed, self.prefetch, self.knobs = workers, seed, prefetch, knobs
        self.start_ahead = start_ahead
        self.ahead: tuple[int, _Started] | None = None  # the next epoch, started while this one drains

    def _epoch(self, epoch: int, ep: EpochPlan, start: int) -> Iterator[Batch]:
        live = {"knobs": self.knobs} if self.knobs is not None else {}
        return self.run(self.plan, self.shards_for(epoch), ep, rank=self.rank, world=self.world,
                        batch_size=self.batch_size, workers=self.workers, seed=self.seed, epoch=epoch, start=start,
                        prefetch_factor=self.prefetch, **live)

    def batches(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None) -> Iterator[Batch]:
        """The epoch's batches of host tensors; the state after each is its step (kept by the loader)."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead[0] == epoch and start == 0 and ep == self.plan_for(epoch):
            yield from ahead[1].take()
            return
        if ahead is not None:
            ahead[1].close()
        yield from self._epoch(epoch, ep, start)

    def prepare(self, epoch: int) -> None:
        """Start making ``epoch``'s first batches on a thread of their own while the current epoch drains.

        Only with ``start_ahead`` (the ``threads`` backend): the ``pil`` backend forks DataLoader
        worker processes, and forking from a second thread while the first epoch's workers and
        threads still run crashed its workers (SIGSEGV); it starts each epoch when asked, as
        torch's DataLoader does.
        """
        if not self.start_ahead or (self.ahead is not None and self.ahead[0] == epoch):
            return
        self.close()
        ep = self.plan_for(epoch)
        count = self.knobs.prefetch if self.knobs is not None else self.prefetch
        self.ahead = (epoch, _Started(lambda: self._epoch(epoch, ep, 0), count))

    def close(self) -> None:
        """Stop and drop a started next epoch (its threads or worker processes end with it)."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            ahead[1].close()


class _Started:
    """An epoch's batches started ahead: the generator made, and its first ``count`` batches taken, on a thread.

    Each batch is handed over as soon as it is made (the first does not wait for the others), through
    a queue; after the ``count``-th the generator itself is handed over, so one thread at a time uses it.
    """

    def __init__(self, make: Callable[[], Iterator[Batch]], count: int) -> None:
        self._items: Iterator[Batch] | None = None
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(make, count), name="feedfast-next-epoch", daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], Iterator[Batch]], count: int) -> None:
        try:
            self._items = make()
            for _ in range(count):
                self._queue.put(("batch", next(self._items)))
        except StopIteration:
            self._queue.put(("end", None))
            return
        except BaseException as exc:  # noqa: BLE001 - re-raised by take(), in the epoch that asks for it
            self._queue.put(("error", exc))
            return
        self._queue.put(("rest", None))

    def take(self) -> Iterator[Batch]:
        """The batches made ahead as they come, then the rest of the epoch."""
        while True:
            kind, value = self._queue.get()
            if kind == "batch":
                yield value
            elif kind == "error":
                raise value
            elif kind == "end":
                return
            else:
                break
        self._thread.join()
        if self._items is not None:
            yield from self._items

    def close(self) -> None:
        """Wait for the start, then close the generator (its threads or worker processes end)."""
        self._thread.join()
        while not self._queue.empty():
            self._queue.get_nowait()
        close = getattr(self._items, "close", None)
        if callable(close):
            close()


def choose_backend(requested: str, plan: Plan, shards: ShardSet) -> str:
    """The backend for ``requested`` (``auto``: ``threads`` where it applies, else ``dali``).

    ``threads`` and ``pil`` run on the CPU over shards with ranged reads (every kind feedfast
    opens: a ``pipe:`` shard is read from the shard cache); ``auto`` also needs every op of the
    spec on the threaded fast path and a PIL that imports (:func:`auto_backend` says why not,
    in a log line on ``feedfast`` at INFO and in ``feedfast plan``).
    """
    if requested not in BACKENDS:
        raise UserError(f"backend must be one of {', '.join(repr(b) for b in BACKENDS)}, got {requested!r}")
    if requested in ("threads", "pil"):
        unranged = rangeread.unranged(shards.read_kinds)
        if unranged is not None:
            raise UserError(f"backend={requested!r} reads shards by byte range, and {unranged!r} shards have none: "
                            "read them through the shard cache, or use backend='dali'")
        if plan.placement != "cpu":
            raise UserError(f"backend={requested!r} runs on the CPU: use placement='cpu' (or backend='dali')")
        return requested
    if requested == "dali":
        return "dali"
    chosen, why = auto_backend(plan, shards)
    if chosen == "dali":  # the threaded path is the faster one on the CPU: say why it was not taken
        log.info("backend auto chose dali: %s", why)
    return chosen


def auto_backend(plan: Plan, shards: ShardSet) -> tuple[str, str]:
    """The backend ``auto`` picks, and why (``feedfast plan`` and a log line say it).

    By speed, not by where the bytes live: on the CPU the threaded path is the faster one
    wherever it runs every op (measured in ``make bench``, remote rows included), and it reads
    remote shards by range ahead of decoding as fast as local ones on loopback
    (``benchmarks/remote.py``).
    """
    if plan.placement != "cpu":
        return "dali", f"the pipeline is placed on {plan.placement}"
    unranged = rangeread.unranged(shards.read_kinds)
    if unranged is not None:
        return "dali", f"{unranged!r} shards have no ranged reads (the threaded path reads by range)"
    try:
        from feedfast.loader.thread_epoch import fast_path_blocker
    except ImportError as exc:  # no PIL
        return "dali", f"PIL does not import ({exc})"
    blocker = fast_path_blocker(plan)
    remote = sorted({kind for kind in shards.read_kinds if kind != "file"})
    where = f", its {', '.join(remote)} shards read by range ahead of decoding" if remote else ""
    if not blocker:
        return "threads", f"every op runs on the threaded path, faster than DALI's CPU pipeline{where}"
    refused = dali_refusal(plan)
    if refused:
        return "threads", f"{blocker}, and DALI cannot run the spec ({refused}): the PIL program per sample, in threads{where}"
    return "dali", blocker


def dali_refusal(plan: Plan) -> str | None:
    """Why DALI has no form for an op of the plan with its parameters (``OpDef.dali``, ``dali_refuses``), or None."""
    from feedfast.ops.registry import OPS

    for n in plan.nodes:
        for op in n.op.split("+") if n.op != "read" else ():
            found = OPS[op]
            if found.dali is None and not found.host:
                return f"op `{op}` ({n.key}) has no DALI form"
            reason = found.dali_refuses(n.params if op == n.op else n.params[op]) if found.dali_refuses else None
            if reason:
                return f"{n.key}: {reason}"
    return None

