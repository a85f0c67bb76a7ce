"""The ``shards`` partition's order: the rank's contiguous range of the shards concatenated in the epoch's
``shard_order`` (DALI's split), as it is, permuted (the ``pil`` and ``threads`` backends outside the global order)
or read in windows (:class:`WindowShuffle`). Each a function of rows, with nothing held per sample."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from feedfast.order.permute import Permutation, mix64


class RangeOrder:
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


class ShuffledRange:
    """A range of ``n`` rows read in the order of a permutation keyed by ``key`` (:mod:`feedfast.order.permute`)."""

    def __init__(self, ranged: RangeOrder, n: int, key: tuple[int, ...]) -> None:
        self.ranged, self.perm = ranged, Permutation(n, key)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return self.ranged(self.perm(rows))


class WindowShuffle:
    """A range of ``n`` rows read in windows of ``window`` consecutive samples, the windows in a random
    order and each one's samples shuffled: as a function of rows, with nothing held per sample.

    Windows are ``window`` consecutive positions of the range (the last may be shorter); their
    order is a permutation by ``key`` (an array of ``n / window``), and inside a window the
    samples are read by a counter-based key of their position, so any stretch of rows is
    computed alone. ``ranged`` maps positions to samples (and back, for :meth:`window_of`).
    """

    def __init__(self, ranged: RangeOrder, n: int, window: int, key: tuple[int, ...]) -> None:
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
