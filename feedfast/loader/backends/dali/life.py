"""One DALI pipeline for a loader's life: built once, fed epoch after epoch through feedfast's feed.

Building a pipeline costs seconds on a GPU (decoders, DALI's threads, streams, memory pools) and
a pipeline per epoch put that cost, and a new feed's start, on the critical path at every epoch
boundary (measured on an H200: a 12 s first batch). A fed pipeline (the global order of a
shuffled epoch, remote shards, rescued images) is instead built once and fed steps from a queue
(:class:`StepQueue`): each epoch's steps are queued as the loader reaches it, the next epoch's
while this one's last steps are in flight, so DALI runs across the boundary without a pause.

DALI asks its external source for iteration ``i`` when it schedules it, up to its queue depth
ahead of the output taken. The queue records what it fed each iteration (:attr:`StepQueue.tags`),
and :meth:`LifePipe.take` takes outputs until it reaches the one wanted: an iteration fed for a
step no longer wanted (an epoch left mid-way, another epoch asked for) or fed nothing (a filler,
when DALI asked before a step was queued) is dropped. DALI's random operators run on from one
epoch to the next: a state carries the checkpoint taken after the epoch's last batch as well
(wrapped with the iteration it resumes at, :func:`~feedfast.loader.backends.dali.rescue.wrap_checkpoint`),
so a run resumed there draws what the uninterrupted one drew. A pipeline is built again only when
something real changes: a state is loaded, or DALI failed a batch (a rescue).
"""

from __future__ import annotations

import random
import threading
from collections import deque
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import Any, Callable, Iterator

from feedfast.compile.plan import Plan
from feedfast.loader.backends.dali.outputs import batch_fields
from feedfast.loader.backends.dali.rescue import Patches, patch_step, wrap_checkpoint
from feedfast.loader.backends.dali.ring import Ring
from feedfast.loader.backends.dali.stream import StreamEpoch
from feedfast.loader.batch import Batch
from feedfast.order.deal import EpochPlan


@dataclass(frozen=True)
class Queued:
    """A step queued for DALI: which epoch's feed (``segment``) and its step."""

    segment: int
    step: int


@dataclass
class Segment:
    """One epoch's steps queued for the pipeline, from ``first`` to ``end`` (exclusive)."""

    epoch: int
    key: Any  # what the epoch's feed was made for (its epoch plan): a prepared epoch is reused when it matches
    stream: StreamEpoch
    first: int
    end: int


class StepQueue:
    """The pipeline's external source: DALI iteration -> the next queued step's members, from its epoch's feed.

    Args:
        patches: images fed as PNG (a rescued pipeline's), None: none.
        holds: DALI's queue depth and one more: what was handed to DALI is kept (referenced) that many
            iterations, as ``no_copy`` asks.
    """

    retains = True
    """What it hands DALI stays untouched until DALI is done with it (``external_source(no_copy=True)``): the last
    ``holds + 1`` batches are referenced here, and a packed feed's ring is written again only later still."""

    def __init__(self, patches: Patches | None, holds: int) -> None:
        self.patches = patches
        self.segments: dict[int, Segment] = {}
        self.tags: dict[int, Queued | None] = {}  # DALI iteration -> what it was fed (None: a filler)
        self._queue: deque[Queued] = deque()
        self._left: dict[int, int] = {}  # segment -> its steps queued, not yet fed
        self._kept: deque[Any] = deque(maxlen=holds + 1)
        self._last: tuple[StreamEpoch, int] | None = None
        self._next_segment = 0
        self._numbered = 0  # steps queued so far: the ring's numbering
        self._lock = threading.Lock()
        self.ring: Ring | None = None  # set by the first packed feed, shared by the later ones

    def add(self, epoch: int, key: Any, make: Callable[[int], StreamEpoch], first: int, end: int) -> int:
        """Queue steps ``first`` .. ``end - 1`` of ``epoch``; ``make(ring_base)`` makes its feed. Returns its segment."""
        with self._lock:
            number, base = self._next_segment, self._numbered - first
            self._next_segment += 1
            self._numbered += end - first
        stream = make(base)
        if self.ring is None:
            self.ring = stream.feeder.ring
        with self._lock:
            self.segments[number] = Segment(epoch, key, stream, first, end)
            self._queue.extend(Queued(number, step) for step in range(first, end))
            self._left[number] = end - first
        return number

    def find(self, epoch: int, key: Any, first: int) -> int | None:
        """The segment queued for ``epoch`` from step ``first`` with its feed made for ``key``, None if none."""
        for number, segment in self.segments.items():
            if (segment.epoch, segment.key, segment.first) == (epoch, key, first):
                return number
        return None

    def keep_only(self, number: int | None) -> None:
        """Drop every segment but ``number``: its queued steps are never fed, its feed stops (its reads end
        before a ring slot they write is used again)."""
        with self._lock:
            self._queue = deque(q for q in self._queue if q.segment == number)
            gone = [self.segments.pop(n) for n in list(self.segments) if n != number]
            self._left = {n: left for n, left in self._left.items() if n == number}
        for segment in gone:
            segment.stream.feeder.close()

    def retire(self, number: int) -> None:
        """Segment ``number`` was served: its feed stops."""
        segment = self.segments.pop(number, None)
        if segment is not None:
            segment.stream.feeder.close()

    def queued(self, segment: int | None = None) -> int:
        """Steps queued and not yet fed (of ``segment`` only, when given)."""
        with self._lock:
            return len(self._queue) if segment is None else self._left.get(segment, 0)

    def __call__(self, info: Any) -> list[Any]:
        iteration = int(getattr(info, "iteration", info))
        with self._lock:
            item = self._queue.popleft() if self._queue else None
            segment = self.segments.get(item.segment) if item is not None else None
            if item is not None:
                self._left[item.segment] -= 1
            ahead = segment.stream.feeder.ahead if segment is not None else 0
            upcoming = [(self.segments.get(q.segment), q.step) for q in islice(self._queue, ahead)
                        if item is not None and q.segment != item.segment]
        for other, step in upcoming:  # the next epoch's first steps, read while this one's last are fed
            if other is not None:
                other.stream.feeder.prefetch(step)
        if item is None or segment is None:  # DALI asked before anything was queued: fed again, dropped
            self.tags[iteration] = None
            arrays = self._filler()
        else:
            self.tags[iteration] = item
            arrays = segment.stream.feeder(item.step)
            if self.patches:
                arrays = patch_step(segment.stream, item.step, arrays, self.patches)
            self._last = (segment.stream, item.step)
        self._kept.append(arrays)
        return arrays

    def _filler(self) -> list[Any]:
        """A batch DALI will run and feedfast drop: the last step fed, copied (its ring slot moves on)."""
        if self._last is None:
            segment = next(iter(self.segments.values()))
            self._last = (segment.stream, segment.first)
        stream, step = self._last
        return stream.feeder.filler(step)

    def close(self) -> None:
        """Stop every feed."""
        self.keep_only(None)
        self.tags.clear()
        self._kept.clear()


@dataclass
class LifePipe:
    """A built DALI pipeline and its step queue, driven one output at a time; epochs' steps are queued to it
    through the feeds ``feed`` makes.

    ``taken``: the DALI iteration of the next output; ``scheduled``: iterations DALI was asked to run
    (its first ``schedule_run`` queues ``depth`` of them, each later one one).
    """

    pipe: Any
    omap: Any
    queue: StepQueue
    depth: int
    feed: Callable[..., StreamEpoch]  # (epoch, epoch plan, **the feed's holds, ring, ring_base) -> its feed
    plan_for: Callable[[int], EpochPlan]  # epoch -> its plan
    taken: int = 0
    scheduled: int = 0
    first_step: int = 0  # the epoch step of a rescued pipeline's first iteration
    rescued: tuple[tuple[str, str], ...] = ()  # the samples it is fed as PNG
    started: bool = False
    origin: int = 0  # the iteration it was built (or restored) at
    _last: tuple[int, str] | None = None  # the last checkpoint taken, and at which iteration

    def __post_init__(self) -> None:
        self.scheduled = self.origin = self.taken

    def segment_for(self, epoch: int, ep: EpochPlan, start: int) -> int:
        """The queued segment of ``epoch``'s steps from ``start``: the prepared one where it matches, else those steps
        queued now. Every other segment (steps fed for another epoch, or an epoch left mid-way) is dropped."""
        segment = self.queue.find(epoch, ep, start)
        if segment is not None and self.queue.segments[segment].stream.lost_any():
            segment = None  # prepared while a shard could not be read: the epoch asks its source again
        self.queue.keep_only(segment)
        return self.queue_epoch(epoch, ep, start) if segment is None else segment

    def queue_epoch(self, epoch: int, ep: EpochPlan, start: int) -> int:
        """Queue ``epoch``'s steps from ``start`` (and the next epoch's, when this one ends before DALI's first call
        has run a full queue: a restored run then feeds what the uninterrupted one fed). Returns its segment."""
        segment = self._queue(epoch, ep, start)
        if not self.started and ep.steps - start < self.depth:
            self._queue(epoch + 1, self.plan_for(epoch + 1), 0)
        return segment

    def prepare(self, epoch: int) -> None:
        """Queue ``epoch``'s steps from its first, unless they are queued already."""
        ep = self.plan_for(epoch)
        if self.queue.find(epoch, ep, 0) is None:
            self._queue(epoch, ep, 0)

    def _queue(self, epoch: int, ep: EpochPlan, start: int) -> int:
        return self.queue.add(epoch, ep, lambda base: self.feed(epoch, ep, holds=self.depth + 1, ring=self.queue.ring,
                                                                ring_base=base), start, ep.steps)

    def _schedule(self) -> None:
        self.pipe.schedule_run()
        self.scheduled += 1 if self.started else self.depth  # DALI's first call queues ``depth`` iterations
        self.started = True

    def prefetch(self) -> None:
        """Start the queued steps without waiting for them."""
        if self.scheduled == self.taken and self.queue.queued():
            self._schedule()

    def take(self, segment: int, step: int, *, before: bool = False) -> tuple[Any, str | None]:
        """The outputs of ``step`` of ``segment`` (queued), dropping those of iterations fed for other steps; with
        ``before``, also the checkpoint right before them where this pipeline made outputs earlier (None: it is
        where it was built or restored)."""
        while True:
            if self.scheduled == self.taken:
                self._schedule()
            tag = self.queue.tags.pop(self.taken, None)  # fed when DALI scheduled it
            wanted = tag is not None and (tag.segment, tag.step) == (segment, step)
            checkpoint = self.checkpoint() if wanted and before and self.taken > self.origin else None
            outs = self.pipe.outputs()
            self.taken += 1
            if self.queue.queued() and self.scheduled - self.taken < self.depth:
                self._schedule()  # keep DALI's queue full, across the epoch boundary too
            if wanted:
                return outs, checkpoint

    def all_scheduled(self, segment: int) -> bool:
        """Whether every step of ``segment`` has been fed to DALI."""
        return not self.queue.queued(segment)

    def checkpoint(self) -> str:
        """DALI's checkpoint after the last output, wrapped with the iteration a pipeline restored from it
        resumes at (and, after a rescue, what rebuilding the rescue needs)."""
        if self._last is not None and self._last[0] == self.taken:  # taken here already (an epoch's last batch)
            return self._last[1]
        state = self.pipe.checkpoint()
        text = state.decode("latin-1") if isinstance(state, bytes) else str(state)
        wrapped = wrap_checkpoint(text, self.first_step, list(self.rescued), iteration=self.taken)
        self._last = (self.taken, wrapped)
        return wrapped


def run_life_epoch(life: LifePipe, segment: int, plan: Plan, ep: EpochPlan, rng: random.Random, start: int, *,
                   every: int) -> Iterator[Batch]:
    """Yield the epoch's batches from ``start`` out of the life pipeline (run on the producer thread).

    Each batch's DALI outputs are left in DALI's memory for the delivery stage
    (:class:`~feedfast.loader.backends.dali.outputs.DaliOutput`); the samples are named, and the components host
    ops read handed over, by the epoch's feed. DALI's checkpoint is taken after every ``every``-th step and after
    the epoch's last step, since the pipeline runs on into the next epoch (a state taken there resumes with the
    draws the uninterrupted run made), and before the first batch where the pipeline made others before it
    (``Batch.before``). A failure of DALI is raised as DALI's ``RuntimeError`` for the backend to rescue or name.
    """
    stream = life.queue.segments[segment].stream
    for step in range(start, ep.steps):
        outs, before = life.take(segment, step, before=step == start)
        last = step + 1 == ep.steps
        checkpoint = life.checkpoint() if (step + 1) % every == 0 or last else None
        size = ep.batch_sizes[step]
        where = stream.origins(step, size)
        lost = stream.lost(step)  # under skip: rows of a shard unreadable mid-epoch
        valid, skipped = lost if lost is not None else (ep.valid[step], ())
        fields = batch_fields(outs, life.omap, plan, size, rng, where, partial(stream.host, step))
        yield Batch(fields, where, valid, checkpoint, lost=skipped, before=before)
