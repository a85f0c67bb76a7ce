"""A rank's samples of one epoch in reading order, as a function of the row: no per-sample list.

Row ``r`` of a rank's epoch is the rank's ``r``-th sample in reading order (padding repeats
the last row, :func:`~feedfast.sources.assign.step_positions`). :class:`Rows` maps rows to
canonical sample numbers (the dataset's shards concatenated, shard 0's indexed samples
first) by a function of the epoch, and the dataset's columnar index
(:mod:`~feedfast.sources.columnar`) maps those to shards, offsets, sizes and keys. Which
function, by the epoch plan's partition (:func:`~feedfast.sources.assign.partition_for`):

- ``global``: the epoch's permutation of every sample (:func:`~feedfast.sources.order.epoch_permutation`)
  dealt out in global batches (:func:`~feedfast.sources.order.rank_position_of`);
- ``shards``: the rank's contiguous range of the shards concatenated in the epoch's
  ``shard_order`` (DALI's split), permuted inside the range when shuffled (the ``pil`` and
  ``threads`` backends outside the global order), or in windows (the stream transport);
- ``block``: the block shuffle of windows (:func:`~feedfast.sources.order.block_order`), held
  as arrays (remote shards; O(the rank's samples), 16 bytes a sample).

Rows are evaluated a chunk at a time and the last chunks kept, so a batch costs a fraction of
a microsecond a sample; nothing grows with the dataset but what ``block`` and windows hold.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from feedfast import _env
from feedfast.sources.assign import EpochPlan, rank_range
from feedfast.sources.columnar import ColumnarIndex, RowBatch, dataset_index
from feedfast.sources.order import BlockShuffle, block_order, epoch_permutation, rank_counts, rank_position_of
from feedfast.sources.permute import Permutation, key_for

CHUNK = 8192
"""Rows evaluated at once (a permutation costs about 0.3 us a row in chunks of this size)."""


class Rows:
    """A rank's samples of an epoch in reading order.

    Args:
        index: the dataset's columnar index.
        count: rows in the epoch (the rank's samples).
        sample_of: rows (int64 array) -> canonical sample numbers.
        window: each row's window of consecutive samples read together (windowed or block shuffle),
            None when rows are read per step.
    """

    def __init__(self, index: ColumnarIndex, count: int, sample_of: Callable[[np.ndarray], np.ndarray],
                 window: np.ndarray | None = None) -> None:
        self.index, self.count, self._sample_of, self.window = index, count, sample_of, window
        self._chunks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.count

    def __reduce__(self) -> tuple[object, ...]:
        return Rows, (self.index, self.count, self._sample_of, self.window)  # without the lock and chunks

    def samples(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """The canonical sample numbers of ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.zeros(0, dtype=np.int64)
        first, last = int(rows.min()) // CHUNK, int(rows.max()) // CHUNK
        if last - first > 4:  # rows spread over the epoch: evaluate them directly
            return self._sample_of(rows)
        out = np.empty(rows.shape, dtype=np.int64)
        for c in range(first, last + 1):
            inside = (rows // CHUNK) == c
            if inside.any():
                out[inside] = self._chunk(c)[rows[inside] - c * CHUNK]
        return out

    def _chunk(self, c: int) -> np.ndarray:
        with self._lock:
            found = self._chunks.get(c)
            if found is not None:
                self._chunks.move_to_end(c)
                return found
        values = self._sample_of(np.arange(c * CHUNK, min(self.count, (c + 1) * CHUNK), dtype=np.int64))
        with self._lock:
            self._chunks[c] = values
            while len(self._chunks) > 4:
                self._chunks.popitem(last=False)
        return values

    def take(self, rows: Sequence[int] | np.ndarray) -> RowBatch:
        """Where the samples of ``rows`` are: sample numbers, shards, offsets and sizes, as arrays."""
        return self.index.take(self.samples(rows))

    def keys(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        """The sample keys of ``rows``."""
        return self.index.keys(self.samples(rows))


class Dataset(Protocol):
    """What :func:`epoch_rows` reads of a dataset (a :class:`~feedfast.sources.dataset.ShardSet`)."""

    @property
    def paths(self) -> tuple[str, ...]: ...

    @property
    def index_paths(self) -> tuple[str, ...]: ...

    @property
    def sizes(self) -> tuple[int, ...]: ...

    @property
    def cache_dir(self) -> str: ...


def epoch_rows(shards: Dataset, exts: Sequence[set[str] | frozenset[str]], ep: EpochPlan, *, rank: int, world: int,
               seed: int, epoch: int, shuffle: bool, window: int = 0,
               block: BlockShuffle | None = None) -> Rows:
    """This rank's rows of the epoch ``ep`` plans (see the module docstring).

    Args:
        shards: the dataset: its shards, their (filtered) indexes, their sample counts and the cache
            folder of its columnar index (empty: the default one).
        exts: each component's extensions.
        ep: the rank's epoch plan (its partition, shard order, samples consumed before a resume).
        shuffle: whether the epoch is shuffled (``global``: a permutation, not the identity;
            ``shards``: the rank's range permuted).
        window: under ``shards``, shuffle the range in windows of this many samples (stream transport).
        block: the block shuffle's sizes, for ``block``.
    """
    sizes = shards.sizes
    index = dataset_index(shards.paths, shards.index_paths, sizes, exts, Path(shards.cache_dir or _env.cache_dir()))
    total = int(sum(sizes))
    if ep.partition == "global":
        remaining = total - ep.consumed
        count = rank_counts(remaining, world=world, batch_size=ep.batch_size)[rank]
        return Rows(index, count, _GlobalOrder(total, remaining, ep, rank=rank, world=world, seed=seed, epoch=epoch,
                                               shuffle=shuffle))
    if ep.partition == "block":
        mine, windows = block_order(sizes, rank=rank, world=world, shuffle=block or BlockShuffle(), seed=seed,
                                    epoch=epoch)
        return Rows(index, len(mine), _Table(mine), windows)
    lo, hi = rank_range(total, rank, world)
    ranged = _RangeOrder(sizes, ep.shard_order, lo)
    if window > 0:
        perm, win = window_shuffle(hi - lo, window, random.Random(f"{seed}/{epoch}/{rank}"))
        return Rows(index, hi - lo, _Table(ranged(np.asarray(perm, dtype=np.int64))), np.asarray(win))
    if shuffle:
        return Rows(index, hi - lo, _Then(Permutation(hi - lo, key_for("feedfast-range", seed, epoch, rank)), ranged))
    return Rows(index, hi - lo, ranged)


class _GlobalOrder:
    """Rows of the global order: the rank's order positions, past ``consumed``, through the permutation."""

    def __init__(self, total: int, remaining: int, ep: EpochPlan, *, rank: int, world: int, seed: int, epoch: int,
                 shuffle: bool) -> None:
        self.remaining, self.consumed, self.batch_size = remaining, ep.consumed, ep.batch_size
        self.rank, self.world = rank, world
        self.perm = epoch_permutation(total, seed=seed, epoch=epoch, shuffle=shuffle)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        positions = self.consumed + rank_position_of(rows, self.remaining, rank=self.rank, world=self.world,
                                                     batch_size=self.batch_size)
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


class _Table:
    """Rows looked up in an array (orders that are materialized)."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return self.table[rows]


class _Then:
    """``second(first(rows))``."""

    def __init__(self, first: Callable[[np.ndarray], np.ndarray], second: Callable[[np.ndarray], np.ndarray]) -> None:
        self.first, self.second = first, second

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return self.second(self.first(rows))


def window_shuffle(n: int, window: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """A permutation of ``range(n)`` visiting windows of ``window`` consecutive items in random
    order, shuffled inside each; and each position's window number."""
    windows = [list(range(start, min(start + window, n))) for start in range(0, n, window)]
    order = list(range(len(windows)))
    rng.shuffle(order)
    perm: list[int] = []
    win: list[int] = []
    for w in order:
        items = windows[w][:]
        rng.shuffle(items)
        perm += items
        win += [w] * len(items)
    return perm, win
