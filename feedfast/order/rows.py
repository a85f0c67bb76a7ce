"""A rank's samples of one epoch in reading order, as a function of the row: no per-sample list.

Row ``r`` of a rank's epoch is the rank's ``r``-th sample in reading order (padding repeats
the last row, :func:`~feedfast.order.deal.step_positions`). :class:`Rows` maps rows to
canonical sample numbers (the dataset's shards concatenated, shard 0's indexed samples
first) by a function of the epoch (:func:`~feedfast.order.orders.order_for`), and the dataset's
columnar index (:mod:`~feedfast.shards.index.columnar`) maps those to shards, offsets, sizes and
keys. Which function, by the epoch plan's partition (:func:`~feedfast.order.deal.partition_for`):

- ``global``: the epoch's permutation of every sample (:func:`~feedfast.order.globalorder.epoch_permutation`)
  dealt out in global batches (:func:`~feedfast.order.deal.rank_position_of`); under repeated
  augmentation its repeated list, spread over ranks (:mod:`~feedfast.order.repeats`);
- ``shards``: the rank's contiguous range of the shards concatenated in the epoch's
  ``shard_order`` (DALI's split), permuted inside the range when shuffled (the ``pil`` and
  ``threads`` backends outside the global order), or in windows (the stream transport);
- ``block``: the block shuffle of windows (:class:`~feedfast.order.block.BlockOrder`), a
  function of rows too (remote shards; a few arrays per window of ``shuffle.window`` samples).

Rows are evaluated a chunk at a time and the last chunks kept, so a batch costs a fraction of
a microsecond a sample; nothing is held per sample: what grows with the dataset is per shard
(the index's offsets) or per window (the block shuffle's and the windowed shuffle's orders).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Callable, Protocol

import numpy as np

from feedfast.order.repeats import sample_of_id
from feedfast.shards.index.columnar import RowBatch

CHUNK = 8192
"""Rows evaluated at once (a permutation costs about 0.3 us a row in chunks of this size)."""


class RowIndex(Protocol):
    """Where a dataset's samples are (:class:`~feedfast.shards.index.columnar.ColumnarIndex`, or a folder's
    :class:`~feedfast.sources.folderindex.FolderIndex`): rows by canonical sample number."""

    components: int

    def __len__(self) -> int: ...

    def take(self, samples: Sequence[int] | np.ndarray) -> RowBatch: ...

    def shard_of(self, samples: np.ndarray) -> np.ndarray: ...

    def keys(self, samples: Sequence[int] | np.ndarray) -> list[str]: ...

    def batch_keys(self, rows: RowBatch) -> list[str]: ...


class Rows:
    """A rank's samples of an epoch in reading order.

    Args:
        index: the dataset's columnar index.
        count: rows in the epoch (the rank's samples).
        sample_of: rows (int64 array) -> canonical sample numbers.
        window: the windows of consecutive samples read together (a windowed or block shuffle:
            :class:`~feedfast.order.shardrange.WindowShuffle`, :class:`~feedfast.order.block.BlockOrder`), None
            when rows are read per step.
    """

    def __init__(self, index: RowIndex, count: int, sample_of: Callable[[np.ndarray], np.ndarray],
                 window: Any = None, copies_of: int = 0) -> None:
        self.index, self.count, self._sample_of, self.window = index, count, sample_of, window
        self.copies_of = copies_of  # > 0: ``sample_of`` gives draw ids of repeated copies over this many samples
        self._chunks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.count

    def __reduce__(self) -> tuple[object, ...]:
        return Rows, (self.index, self.count, self._sample_of, self.window, self.copies_of)  # without lock, chunks

    def samples(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """The canonical sample numbers of ``rows``."""
        ids = self.draw_ids(rows)
        return sample_of_id(ids, self.copies_of) if self.copies_of else ids

    def draw_ids(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """What the augmentation draws of ``rows`` are keyed by: the sample numbers, or under repeated
        augmentation each copy's own (:func:`~feedfast.order.repeats.draw_ids`)."""
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
        """Where the samples of ``rows`` are: sample numbers, shards, offsets and sizes (and draw ids), as arrays."""
        if not self.copies_of:
            return self.index.take(self.samples(rows))
        ids = self.draw_ids(rows)
        return dataclasses.replace(self.index.take(sample_of_id(ids, self.copies_of)), draws=ids)

    def shards(self, rows: Sequence[int] | np.ndarray) -> list[int]:
        """The shard of each of ``rows``, from the index's shard starts (no read)."""
        return self.index.shard_of(self.samples(rows)).tolist()

    def keys(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        """The sample keys of ``rows``."""
        return self.index.keys(self.samples(rows))


class Dataset(Protocol):
    """What :func:`~feedfast.order.orders.epoch_rows` reads of a dataset (a
    :class:`~feedfast.sources.dataset.ShardSet`, a :class:`~feedfast.sources.folder.FolderSet`): its samples per
    shard and its index of rows."""

    @property
    def sizes(self) -> tuple[int, ...]: ...

    def row_index(self, exts: Sequence[set[str] | frozenset[str]]) -> RowIndex: ...
