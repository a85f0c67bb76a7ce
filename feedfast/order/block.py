"""The block order of remote shards: windows of every shard, permuted, spread over a block (:class:`BlockOrder`), a
pure function of (seed, epoch, rank, world) and the rows asked for."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from feedfast.order.deal import rank_range
from feedfast.order.permute import key_for, mix64
from feedfast.spec.model import SHUFFLE_BLOCK, SHUFFLE_WINDOW


@dataclass(frozen=True)
class BlockShuffle:
    """The block shuffle's sizes (the spec's ``shuffle.block`` and ``shuffle.window``).

    Attributes:
        window: consecutive samples of a shard read together (one ranged request).
        block: samples over which each window's samples are spread; about ``block`` samples
            (``block / window`` windows of many shards) are held in memory at once.
    """

    block: int = SHUFFLE_BLOCK
    window: int = SHUFFLE_WINDOW


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def shard_windows(sizes: Sequence[int], window: int) -> tuple[np.ndarray, np.ndarray]:
    """Each shard cut into windows of ``window`` consecutive samples (a shard's last one may be
    shorter): the windows' first sample numbers (canonical concatenation) and lengths.

    >>> [a.tolist() for a in shard_windows([5, 3], 2)]
    [[0, 2, 4, 5, 7], [2, 2, 1, 2, 1]]
    """
    counts = np.asarray(sizes, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    per = -(-counts // window)
    shard = np.repeat(np.arange(len(counts)), per)
    k = np.arange(int(per.sum()), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
    return first[shard] + k * window, np.minimum(window, counts[shard] - k * window)


class BlockOrder:
    """Rank ``rank``'s samples of a block-shuffled epoch as a function of its rows: nothing held per sample.

    The order (see :func:`block_order`, its array form):

    1. Every shard is cut into windows of ``shuffle.window`` consecutive samples
       (:func:`shard_windows`), and the windows of all shards are permuted by (seed, epoch).
    2. Their samples, concatenated in that order, are cut into ``world`` contiguous ranges as
       DALI cuts shards (:func:`~feedfast.order.deal.rank_range`): every sample once, and
       the ranks' counts are those of an unshuffled epoch (padding counted the same way).
    3. Inside the rank's range each window's samples are spread at random over about
       ``shuffle.block`` positions around the window's place (MosaicML Streaming's ``py1e``,
       over windows instead of whole shards): each sample's key is its place plus a uniform
       shift in ``±(block - len) / 2``, clipped to the range, and the samples are read in key
       order. At any point about ``block / window`` windows, from as many shards, are being read.

    A sample's shift is drawn from a counter-based generator keyed by (seed, epoch, rank, world)
    and its place, so the keys of any stretch of places can be computed alone; a shift is at most
    ``block / 2``, so the samples read at rows ``r0 .. r1`` are those of the places within
    ``block + 4`` of that range, sorted (:meth:`__call__` sorts that stretch only). What is held:
    a few arrays per window (the windows' permutation and the rank's runs), about ``1 / window``
    of a per-sample list.
    """

    def __init__(self, sizes: Sequence[int], *, rank: int, world: int, shuffle: BlockShuffle, seed: int,
                 epoch: int) -> None:
        self.starts, lengths = shard_windows(sizes, shuffle.window)
        perm = _rng("feedfast-blocks", seed, epoch).permutation(len(self.starts))
        lens = lengths[perm]
        ends = np.cumsum(lens)
        total = int(ends[-1]) if len(ends) else 0
        lo, hi = rank_range(total, rank, world)
        self.count = n = hi - lo
        k = np.arange(np.searchsorted(ends, lo, side="right"), np.searchsorted(ends, hi, side="left") + 1 if n else 0)
        k = k[k < len(ends)]
        begin = np.maximum(lo, ends[k] - lens[k])
        self.run_start = begin - lo  # each run's first place: a window, cut where the range cuts it
        self.run_len = np.minimum(hi, ends[k]) - begin
        self.run_window = perm[k]
        self.run_first = self.starts[perm[k]] + begin - (ends[k] - lens[k])  # the run's first sample
        cut = np.maximum(0.0, (shuffle.block - self.run_len) / 2)
        self.low = np.maximum(-cut, -self.run_start)
        self.high = np.minimum(cut, n - self.run_start - self.run_len)
        self.margin = int(shuffle.block) + 4
        self.key = np.uint64(key_for("feedfast-block-shift", seed, epoch, rank, world)[0])
        self._run_of = np.argsort(self.run_window, kind="stable")  # runs by window number

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        """The canonical sample numbers read at ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty(rows.shape, dtype=np.int64)
        if rows.size == 0:
            return out
        step = max(self.margin, 4096)
        stretch = rows // step
        for c in np.unique(stretch).tolist():
            inside = stretch == c
            r0 = c * step
            out[inside] = self._stretch(r0, min(self.count, r0 + step))[rows[inside] - r0]
        return out

    def _stretch(self, r0: int, r1: int) -> np.ndarray:
        """The samples read at rows ``r0 .. r1 - 1``: the places around, sorted by key."""
        a, b = max(0, r0 - self.margin), min(self.count, r1 + self.margin)
        places = np.arange(a, b, dtype=np.int64)
        run = np.searchsorted(self.run_start, places, side="right") - 1
        with np.errstate(over="ignore"):
            u = (mix64(places.astype(np.uint64) ^ self.key) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        keys = places + self.low[run] + u * (self.high[run] - self.low[run])
        chosen = np.argsort(keys, kind="stable")[r0 - a: r1 - a]  # ties: the earlier place first
        return self.run_first[run[chosen]] + chosen + a - self.run_start[run[chosen]]

    def window_of(self, samples: np.ndarray) -> np.ndarray:
        """Each sample's window number (into :func:`shard_windows`' list)."""
        return np.searchsorted(self.starts, np.asarray(samples, dtype=np.int64), side="right") - 1

    def place(self, window: int) -> int:
        """Where ``window``'s samples are read in this rank's order: its run's first row, around which they are
        spread over about ``block`` rows (-1: not one of this rank's windows)."""
        i = np.searchsorted(self.run_window, window, sorter=self._run_of)
        if i >= len(self._run_of) or self.run_window[self._run_of[i]] != window:
            return -1
        return int(self.run_start[self._run_of[i]])

    @property
    def horizon(self) -> int:
        """Rows over which a window's samples are read (``block``, and a margin)."""
        return self.margin

    def members(self, window: int) -> np.ndarray:
        """The samples of ``window`` this rank reads (the whole window, or the part inside its range)."""
        i = np.searchsorted(self.run_window, window, sorter=self._run_of)
        if i >= len(self._run_of) or self.run_window[self._run_of[i]] != window:
            return np.zeros(0, dtype=np.int64)
        r = self._run_of[i]
        return self.run_first[r] + np.arange(self.run_len[r], dtype=np.int64)


def block_order(sizes: Sequence[int], *, rank: int, world: int, shuffle: BlockShuffle, seed: int,
                epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """:class:`BlockOrder` as arrays: rank ``rank``'s samples in reading order, and each one's window.

    Deterministic for (seed, epoch, rank, world). Returns canonical sample numbers (shard 0's
    samples first) and window numbers (into :func:`shard_windows`' list). For tests and tools:
    the loader evaluates :class:`BlockOrder` a stretch of rows at a time.
    """
    order = BlockOrder(sizes, rank=rank, world=world, shuffle=shuffle, seed=seed, epoch=epoch)
    samples = order(np.arange(order.count, dtype=np.int64))
    return samples, order.window_of(samples)
