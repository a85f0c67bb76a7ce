"""A rank's reading order of an epoch, as a function of rows, by the epoch plan's partition.

:func:`order_for` picks it (see :mod:`feedfast.order.rows`, which maps its samples to shards): the global
permutation dealt out in global batches (``global``), the block shuffle of windows (``block``), or the rank's
contiguous range of the shards in the epoch's order, permuted, in windows or as it is (``shards``). Each is a
pure function of (seed, epoch, rank, world) and the rows asked for; nothing is held per sample.

The global order. With ``shuffle=True`` an epoch reads every sample of the dataset (all shards, in their
canonical concatenation: shard 0's indexed samples, then shard 1's, ...) in the order of a
random permutation fixed by (seed, epoch): :func:`epoch_permutation`, a function from position
to sample number evaluated per batch (:mod:`feedfast.order.permute`), so an epoch's order
costs no memory whatever the dataset's size. Class-sorted shards give batches that are
statistically those of torch's ``RandomSampler``, which a shard shuffle plus a buffer shuffle
cannot (DALI #3088).

The order is dealt out in global batches (:func:`~feedfast.order.deal.rank_positions`, or row by row
:func:`~feedfast.order.deal.rank_position_of`, in :mod:`feedfast.order.deal`): global step ``s`` takes
the next ``world * batch`` samples of the order, rank ``r`` the ``r``-th run of ``batch`` of
them. The last, incomplete global batch is split as evenly as possible (ranks ``r`` get
``rank_range(rest, r, world)``), and the last-batch policy then pads or drops as for any
rank (:mod:`feedfast.order.deal`). So the samples consumed after ``s`` full steps are
exactly the first ``s * world * batch`` of the order, whatever the world size: a state is a
cursor into the order, and a run can resume at another world size or batch size with no
sample lost or repeated (and, with the same global batch, the same global sequence).

Example: 10 samples, order ``[7 2 9 0 4 1 8 3 6 5]``, 2 ranks, batch 2: step 0 gives rank 0
``[7 2]`` and rank 1 ``[9 0]``; step 1 ``[4 1]`` and ``[8 3]``; the rest ``[6 5]`` is split
into ``[6]`` and ``[5]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from feedfast.order.block import BlockOrder, BlockShuffle
from feedfast.order.deal import EpochPlan, rank_counts, rank_position_of, rank_range
from feedfast.order.permute import Permutation, key_for, mix64
from feedfast.order.repeats import draw_ids, entry_of, repeated


def epoch_permutation(total: int, *, seed: int, epoch: int, shuffle: bool) -> Permutation | None:
    """The epoch's order as a function (position -> sample number), or None for the identity.

    A bijection of ``0..total-1`` fixed by (seed, epoch), the same on every machine
    (:mod:`feedfast.order.permute`): O(1) memory, evaluated per batch.
    """
    return Permutation(total, key_for("feedfast-order", seed, epoch)) if shuffle else None


def epoch_order(total: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The whole epoch order as an array (8 bytes a sample: for tests and small sets; the loader
    evaluates :func:`epoch_permutation` per batch instead)."""
    positions = np.arange(total, dtype=np.int64)
    perm = epoch_permutation(total, seed=seed, epoch=epoch, shuffle=shuffle)
    return positions if perm is None else perm(positions)


@dataclass(frozen=True)
class Order:
    """A rank's order: ``count`` rows, ``sample_of(rows)`` their canonical samples (draw ids under repeated
    augmentation over ``copies_of`` samples, else 0), ``window`` the windows read together (None: per step)."""

    count: int
    sample_of: Callable[[np.ndarray], np.ndarray]
    window: Any = None
    copies_of: int = 0


def order_for(sizes: Sequence[int], ep: EpochPlan, *, rank: int, world: int, seed: int, epoch: int, shuffle: bool,
              window: int = 0, block: BlockShuffle | None = None) -> Order:
    """This rank's order of the epoch ``ep`` plans over shards of ``sizes`` samples (see the module docstring);
    ``window``: under ``shards``, shuffle the range in windows of this many samples; ``block``: the block
    shuffle's sizes."""
    total = int(sum(sizes))
    if ep.partition == "global":
        remaining = total - ep.consumed
        count = rank_counts(remaining, world=world, batch_size=ep.batch_size)[rank]
        return Order(count, _GlobalOrder(total, remaining, ep, rank=rank, world=world, seed=seed, epoch=epoch,
                                         shuffle=shuffle), copies_of=total if ep.repeats > 1 else 0)
    if ep.partition == "block":
        blocks = BlockOrder(sizes, rank=rank, world=world, shuffle=block or BlockShuffle(), seed=seed, epoch=epoch)
        return Order(blocks.count, blocks, blocks)
    lo, hi = rank_range(total, rank, world)
    ranged = _RangeOrder(sizes, ep.shard_order, lo)
    if window > 0:
        shuffled = WindowShuffle(ranged, hi - lo, window, key_for("feedfast-windows", seed, epoch, rank))
        return Order(hi - lo, shuffled, shuffled)
    if shuffle:
        return Order(hi - lo, _Then(Permutation(hi - lo, key_for("feedfast-range", seed, epoch, rank)), ranged))
    return Order(hi - lo, ranged)


class _GlobalOrder:
    """Rows of the global order: the rank's order positions, past ``consumed``, through the permutation."""

    def __init__(self, total: int, remaining: int, ep: EpochPlan, *, rank: int, world: int, seed: int, epoch: int,
                 shuffle: bool) -> None:
        self.remaining, self.consumed, self.batch_size = remaining, ep.consumed, ep.batch_size
        self.rank, self.world, self.total, self.repeats = rank, world, total, ep.repeats
        self.perm = epoch_permutation(total, seed=seed, epoch=epoch, shuffle=shuffle)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        relative = rank_position_of(rows, self.remaining, rank=self.rank, world=self.world, batch_size=self.batch_size)
        if self.repeats > 1:  # repeated augmentation: entries of the repeated list, as draw ids (order/repeats.py)
            entries = self.consumed + entry_of(relative, self.remaining, world=self.world, batch_size=self.batch_size)
            return draw_ids(*repeated(entries, self.perm, self.repeats), self.total)
        positions = self.consumed + relative
        return positions if self.perm is None else self.perm(positions)


class _RangeOrder:
    """Rows of a contiguous range starting at ``lo`` of the shards concatenated in ``order``."""

    def __init__(self, sizes: Sequence[int], order: Sequence[int], lo: int) -> None:
        counts = np.asarray(sizes, dtype=np.int64)
        self.lo = lo
        self.identity = list(order) == list(range(len(counts)))
        self.order = np.asarray(order, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])[:-1]  # canonical first sample of each shard
        self.ends = np.cumsum(counts[self.order])  # end of each shard in the epoch's concatenation
        self.begins = self.ends - counts[self.order]

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        at = self.lo + np.asarray(rows, dtype=np.int64)
        if self.identity:
            return at
        j = np.searchsorted(self.ends, at, side="right")
        return self.starts[self.order[j]] + at - self.begins[j]

    def position_of(self, samples: np.ndarray) -> np.ndarray:
        """The rows at which ``samples`` (canonical numbers inside the range) are read: the inverse."""
        samples = np.asarray(samples, dtype=np.int64)
        if self.identity:
            return samples - self.lo
        shard = np.searchsorted(self.starts, samples, side="right") - 1
        place = np.empty(len(self.order), dtype=np.int64)
        place[self.order] = np.arange(len(self.order))
        j = place[shard]
        return self.begins[j] + samples - self.starts[shard] - self.lo


class _Then:
    """``second(first(rows))``."""

    def __init__(self, first: Callable[[np.ndarray], np.ndarray], second: Callable[[np.ndarray], np.ndarray]) -> None:
        self.first, self.second = first, second

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return self.second(self.first(rows))


class WindowShuffle:
    """A range of ``n`` rows read in windows of ``window`` consecutive samples, the windows in a random
    order and each one's samples shuffled: as a function of rows, with nothing held per sample.

    Windows are ``window`` consecutive positions of the range (the last may be shorter); their
    order is a permutation by ``key`` (an array of ``n / window``), and inside a window the
    samples are read by a counter-based key of their position, so any stretch of rows is
    computed alone. ``ranged`` maps positions to samples (and back, for :meth:`window_of`).
    """

    def __init__(self, ranged: _RangeOrder, n: int, window: int, key: tuple[int, ...]) -> None:
        self.ranged, self.n, self.window = ranged, n, window
        count = -(-n // window)
        self.order = np.random.Generator(np.random.PCG64(key[0])).permutation(count)
        self.lens = np.minimum(window, n - self.order * window)
        self.ends = np.cumsum(self.lens)
        self.key = np.uint64(key[1])

    def positions(self, rows: np.ndarray) -> np.ndarray:
        """The range's positions read at ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return rows
        k = np.searchsorted(self.ends, rows, side="right")
        ks = np.unique(k)
        w, lens = self.order[ks], self.lens[ks]
        pos = np.repeat(w * self.window - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
        group = np.repeat(np.arange(len(ks)), lens)
        with np.errstate(over="ignore"):
            u = mix64(pos.astype(np.uint64) ^ self.key)
        shuffled = pos[np.lexsort((u, group))]  # each window's positions in key order, the windows in turn
        first = np.cumsum(lens) - lens  # where each window starts in ``shuffled``
        at = first[np.searchsorted(ks, k)] + rows - (self.ends[k] - self.lens[k])
        return shuffled[at]

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return self.ranged(self.positions(rows))

    def window_of(self, samples: np.ndarray) -> np.ndarray:
        """Each sample's window number (its position in the range // ``window``)."""
        return self.ranged.position_of(samples) // self.window

    def members(self, window: int) -> np.ndarray:
        """The samples of window ``window``."""
        start = window * self.window
        return self.ranged(np.arange(start, min(self.n, start + self.window), dtype=np.int64))
