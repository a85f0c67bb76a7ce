"""Dealing an epoch's samples to ranks, the one owner of it: pure functions of (sizes, world, rank, batch).

The shards of an epoch are concatenated in that epoch's order and cut into ``world``
contiguous ranges exactly as DALI's readers cut them: rank ``r`` reads samples
``[r * N // world, (r + 1) * N // world)``. Every rank runs the same number of steps, so
DDP never waits at the end of an epoch:

=============  ===========================  ====================================
last_batch     steps per epoch              batch ``j`` on every rank holds
=============  ===========================  ====================================
``partial``    ceil(max_r n_r / B)          as many samples as the largest rank's
                                            batch ``j``; ranks with fewer real
                                            samples fill with padding
``pad``        ceil(max_r n_r / B)          B samples, padding at the end
``drop``       floor(min_r n_r / B)         B real samples; the rest are dropped
=============  ===========================  ====================================

Example: 7 samples, 1 rank, batch 2: ``partial`` gives 2, 2, 2, 1 (no padding);
``pad`` gives 2, 2, 2, 2 with 1 padded; ``drop`` gives 2, 2, 2 and drops 1.
With 9 samples on 2 ranks (4 and 5), batch 2, ``partial``: rank 0 yields 2, 2, 1
where its last sample is padding; rank 1 yields 2, 2, 1, all real.
Padding repeats the rank's last sample and always sits at the end of a batch.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedfast.shards.transport import schemes


class Runs(Sequence[int]):
    """A tuple of ints stored as runs of equal values: a rank's per-step sizes in O(1), whatever the steps.

    >>> Runs(((4, 3), (1, 1))) == (4, 4, 4, 1)
    True
    """

    def __init__(self, runs: Iterable[tuple[int, int]]) -> None:
        self.runs = tuple((int(v), int(n)) for v, n in runs if n > 0)
        ends, at = [], 0
        for _, n in self.runs:
            at += n
            ends.append(at)
        self._ends = ends

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("step out of range")
        return self.runs[bisect.bisect_right(self._ends, i)][0]

    def __iter__(self) -> Iterator[int]:
        for v, n in self.runs:
            yield from itertools.repeat(v, n)

    def total(self) -> int:
        """The sum of the values."""
        return sum(v * n for v, n in self.runs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Runs):
            return self.runs == other.runs
        return isinstance(other, (tuple, list)) and len(other) == len(self) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(self.runs)

    def __repr__(self) -> str:
        return f"Runs({self.runs})"


def capped(cap: int, total: int, steps: int, floor: int) -> Runs:
    """``max(floor, min(cap, total - j * cap))`` for each step ``j`` of ``steps``, as runs."""
    full = max(0, min(steps, total // cap))
    rest = [(max(floor, min(cap, total - full * cap)), 1)] if full < steps else []
    return Runs([(cap, full), *rest, (floor, steps - full - 1)])


@dataclass(frozen=True)
class EpochPlan:
    """What one rank does in one epoch."""

    shard_order: tuple[int, ...]
    rank_samples: int
    steps: int
    batch_sizes: Runs  # per step: the samples it yields (padding included)
    valid: Runs  # per step: its real samples
    partition: str = "shards"  # "shards" (DALI's ranges), "global" (global batches), "block": see partition_for
    consumed: int = 0  # samples of the epoch's global order consumed before this plan (an elastic resume)
    batch_size: int = 0  # the batch size the plan deals out
    repeats: int = 1  # repeated augmentation: each sample's copies in the epoch's order (order/repeats.py)

    @property
    def padded(self) -> int:
        """How many padded (repeated) samples this rank yields this epoch."""
        return self.batch_sizes.total() - self.valid.total()

    @property
    def dropped(self) -> int:
        """How many of this rank's samples ``drop`` leaves out this epoch."""
        return self.rank_samples - self.valid.total()


def partition_for(read_kinds: tuple[str, ...], *, shuffled: bool, by_range: bool = False) -> str:
    """How an epoch's samples are ordered and dealt to ranks; the one rule, for every reader:

    ==========  ==================================  ===========================================
    partition   when                                order (:mod:`feedfast.order.orders`)
    ==========  ==================================  ===========================================
    ``shards``  not shuffled                        the shards in order; each rank a contiguous
                                                    range (DALI's split)
    ``global``  shuffled, every shard a local file, one uniform permutation of the whole
                or (``by_range``) every shard of a  dataset, dealt out in global batches
                kind that reads single samples
                cheaply (the shard cache)
    ``block``   shuffled, otherwise (http, s3, gs;  windows of many shards interleaved (the
                any remote shard on DALI's feed)    block shuffle), each rank a contiguous
                                                    range of the shuffled windows
    ==========  ==================================  ===========================================

    A sample read costs a request on a remote shard. DALI's feed reads remote shards a window
    of consecutive samples at a time. The CPU paths (``by_range``: the ``threads`` and ``pil``
    backends) read shards whose kind reads single samples cheaply (``Kind.sample_reads`` in
    :mod:`.schemes`: local files and the shard cache, where a ``pipe:`` shard or, under
    ``on_error: skip``, a checked download is read) sample by sample, so they keep the global
    order, and with it the elastic resume, over those; a request per sample costs too much CPU
    (see :mod:`.schemes`), so http, s3 and gs shards are read a window at a time, by range,
    ahead of decoding (:mod:`feedfast.sources.rangeread`).
    """
    if not shuffled:
        return "shards"
    if all(k == "file" for k in read_kinds) or (by_range and all(schemes.kind(k).sample_reads for k in read_kinds)):
        return "global"
    return "block"


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> tuple[int, ...]:
    """The epoch's shard order: a permutation fixed by (seed, epoch), or the given order."""
    order = list(range(num_shards))
    if shuffle:
        random.Random(f"feedfast-shards/{seed}/{epoch}").shuffle(order)
    return tuple(order)


def rank_range(total: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s half-open range of the epoch's concatenated samples (DALI's rule)."""
    return rank * total // world, (rank + 1) * total // world


def step_positions(step: int, batch_size: int, count: int, size: int | None = None) -> list[int]:
    """Positions in a rank's ``count`` ordered samples for step ``step``; padding repeats the last.

    ``size`` (default ``batch_size``) is how many the step yields: ``EpochPlan.batch_sizes``.

    >>> step_positions(3, 2, 7)
    [6, 6]
    """
    first = step * batch_size
    return [min(first + k, count - 1) for k in range(batch_size if size is None else size)]


def plan_epoch(
    sizes: list[int], *, batch_size: int, rank: int, world: int, last_batch: str,
    seed: int = 0, epoch: int = 0, shuffle_shards: bool = False, partition: str = "shards", consumed: int = 0,
    repeats: int = 1,
) -> EpochPlan:
    """Rank ``rank``'s epoch: shard order, its sample count, steps and per-step sizes.

    ``partition="shards"`` cuts the shards, concatenated in the epoch's shard order, into
    contiguous ranges (DALI's reader). ``"global"`` deals the epoch's global order out in
    global batches after its first ``consumed`` samples (:mod:`feedfast.order.globalorder`).
    ``"block"`` cuts the shuffled windows into contiguous ranges: the counts of ``"shards"``,
    with the shards in their canonical order (:func:`~feedfast.order.block.block_order`).
    ``repeats`` > 1 (``global`` only) reads the repeated list instead, with the same counts
    (:mod:`feedfast.order.repeats`).
    """
    if repeats > 1 and partition != "global":
        raise ValueError(f"repeats={repeats} needs the global order (shuffled local shards), not {partition!r}")
    if partition == "global":
        counts = rank_counts(sum(sizes) - consumed, world=world, batch_size=batch_size)
        shuffle_shards = False  # the order is over samples; shards stay in their canonical order
    else:
        total = sum(sizes)
        counts = [b - a for a, b in (rank_range(total, r, world) for r in range(world))]
        shuffle_shards = shuffle_shards and partition == "shards"  # a block shuffle permutes windows instead
    mine, biggest = counts[rank], max(counts)
    b = batch_size
    if last_batch == "drop":
        steps = min(counts) // b
        sizes_out = valid = Runs([(b, steps)])
    else:
        steps = -(-biggest // b)
        valid = capped(b, mine, steps, 0)
        sizes_out = Runs([(b, steps)]) if last_batch == "pad" else capped(b, biggest, steps, 1)
    order = shard_order(len(sizes), seed=seed, epoch=epoch, shuffle=shuffle_shards)
    return EpochPlan(order, mine, steps, sizes_out, valid, partition, consumed, batch_size, repeats)


def rank_counts(total: int, *, world: int, batch_size: int) -> list[int]:
    """How many of ``total`` samples each rank gets when they are dealt out in global batches."""
    step = world * batch_size
    full, rest = divmod(total, step)
    return [full * batch_size + b - a for a, b in (rank_range(rest, r, world) for r in range(world))]


def rank_positions(total: int, *, rank: int, world: int, batch_size: int) -> np.ndarray:
    """Rank ``rank``'s positions in the epoch's order, in the order it reads them.

    >>> rank_positions(10, rank=1, world=2, batch_size=2).tolist()
    [2, 3, 6, 7, 9]
    """
    step = world * batch_size
    full, rest = divmod(total, step)
    starts = np.arange(full, dtype=np.int64) * step + rank * batch_size
    body = (starts[:, None] + np.arange(batch_size, dtype=np.int64)[None, :]).reshape(-1)
    a, b = rank_range(rest, rank, world)
    tail = full * step + np.arange(a, b, dtype=np.int64)
    return np.concatenate([body, tail])


def rank_position_of(rows: np.ndarray, total: int, *, rank: int, world: int, batch_size: int) -> np.ndarray:
    """``rank_positions(total, ...)[rows]`` without the array: the order positions of a rank's rows.

    >>> rank_position_of(np.array([0, 2, 4]), 10, rank=1, world=2, batch_size=2).tolist()
    [2, 6, 9]
    """
    rows = np.asarray(rows, dtype=np.int64)
    step = world * batch_size
    full, rest = divmod(total, step)
    a, _ = rank_range(rest, rank, world)
    body = (rows // batch_size) * step + rank * batch_size + rows % batch_size
    return np.where(rows < full * batch_size, body, full * step + a + (rows - full * batch_size))
