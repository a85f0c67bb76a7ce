"""A rank's samples of one epoch, read from the shards' indexes: where each one's bytes are.

The samples are the shards' (filtered) indexes concatenated in the epoch's ``shard_order``,
and a rank reads its contiguous range of them (:func:`~feedfast.sources.assign.rank_range`),
as DALI's reader does; or, shuffled, its share of the global order (:func:`global_rows`) or
of the block shuffle (:func:`block_rows`). The stream transport and the PIL backend read
samples this way.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from feedfast.sources.assign import rank_range
from feedfast.sources.index import first_member, read_index
from feedfast.sources.order import BlockShuffle, block_order


@dataclass(frozen=True)
class Rows:
    """A rank's samples in reading order.

    Attributes:
        shard: each row's shard number (into the ShardSet).
        keys: each row's sample key.
        offsets, sizes: (offset, size) per row and component; size -1: no such member.
        position: each row's place in the epoch's concatenation of all shards.
        window: each row's window of consecutive samples, read together (windowed or block shuffle;
            None: rows are read per step).
    """

    shard: np.ndarray
    keys: list[str]
    offsets: np.ndarray
    sizes: np.ndarray
    position: np.ndarray
    window: np.ndarray | None = None

    def take(self, perm: list[int], window: np.ndarray | None = None) -> "Rows":
        """The rows reordered by ``perm``."""
        return Rows(self.shard[perm], [self.keys[j] for j in perm], self.offsets[perm], self.sizes[perm],
                    self.position[perm], window)


def _shard_rows(index_path: str, name: str, count: int,
                exts: Sequence[set[str] | frozenset[str]]) -> tuple[list[str], np.ndarray, np.ndarray]:
    samples = read_index(index_path, name, count)
    offsets = np.zeros((count, len(exts)), dtype=np.int64)
    sizes = np.full((count, len(exts)), -1, dtype=np.int64)
    for i, s in enumerate(samples):
        for c, wanted in enumerate(exts):
            m = first_member(s, wanted)
            if m is not None:
                offsets[i, c], sizes[i, c] = m.offset, m.size
    return [s.key for s in samples], offsets, sizes


def rank_rows(names: tuple[str, ...], index_paths: tuple[str, ...], counts: tuple[int, ...], order: tuple[int, ...],
              exts: Sequence[set[str] | frozenset[str]], *, rank: int, world: int, window: int, seed: int,
              epoch: int) -> Rows:
    """This rank's samples of the epoch, reading only the indexes of shards its range touches.

    ``window > 0`` shuffles them in windows (:func:`window_shuffle`) with
    ``random.Random(f"{seed}/{epoch}/{rank}")``; 0 keeps the concatenation order.
    """
    lo, hi = rank_range(sum(counts[i] for i in order), rank, world)
    shard, keys, offs, sizes = [], [], [], []
    pos = 0
    for i in order:
        a, b = max(lo, pos), min(hi, pos + counts[i])
        if a < b:
            k, o, s = _shard_rows(index_paths[i], names[i], counts[i], exts)
            shard.append(np.full(b - a, i, dtype=np.int32))
            keys += k[a - pos: b - pos]
            offs.append(o[a - pos: b - pos])
            sizes.append(s[a - pos: b - pos])
        pos += counts[i]
    rows = Rows(np.concatenate(shard), keys, np.concatenate(offs), np.concatenate(sizes), np.arange(lo, hi))
    if window <= 0:
        return rows
    perm, win = window_shuffle(len(keys), window, random.Random(f"{seed}/{epoch}/{rank}"))
    return rows.take(perm, np.asarray(win))


def global_rows(names: tuple[str, ...], index_paths: tuple[str, ...], counts: tuple[int, ...],
                exts: Sequence[set[str] | frozenset[str]], *, rank: int, world: int, batch_size: int, seed: int,
                epoch: int, shuffle: bool, consumed: int = 0) -> Rows:
    """This rank's samples of the epoch in the global order (:mod:`feedfast.sources.order`).

    The order permutes every sample of every shard, so every shard's index is read. Each
    row's ``position`` is its number in the canonical concatenation of the shards (the same
    at any world size: per-sample randomness keyed by it does not depend on the rank).
    ``consumed`` leaves out the order's first samples (taken before an elastic resume).
    """
    from feedfast.sources.order import epoch_order, rank_positions

    total = sum(counts)
    order = epoch_order(total, seed=seed, epoch=epoch, shuffle=shuffle)[consumed:]
    mine = order[rank_positions(total - consumed, rank=rank, world=world, batch_size=batch_size)]
    shard, keys, offs, sizes = _all_rows(names, index_paths, counts, tuple(tuple(sorted(e)) for e in exts))
    return Rows(shard[mine], [keys[i] for i in mine.tolist()], offs[mine], sizes[mine], mine)


def block_rows(names: tuple[str, ...], index_paths: tuple[str, ...], counts: tuple[int, ...],
               exts: Sequence[set[str] | frozenset[str]], *, rank: int, world: int, shuffle: BlockShuffle, seed: int,
               epoch: int) -> Rows:
    """This rank's samples of a block-shuffled epoch (:func:`~feedfast.sources.order.block_order`).

    ``window`` holds each row's window of consecutive samples (one shard's), the unit the
    stream transport reads in one request; ``position`` is the row's canonical number.
    """
    mine, windows = block_order(counts, rank=rank, world=world, shuffle=shuffle, seed=seed, epoch=epoch)
    shard, keys, offs, sizes = _all_rows(names, index_paths, counts, tuple(tuple(sorted(e)) for e in exts))
    return Rows(shard[mine], [keys[i] for i in mine.tolist()], offs[mine], sizes[mine], mine, windows)


@lru_cache(maxsize=4)
def _all_rows(names: tuple[str, ...], index_paths: tuple[str, ...], counts: tuple[int, ...],
              exts: tuple[tuple[str, ...], ...]) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """Every sample of the shards in canonical order: shard numbers, keys, offsets, sizes (cached across epochs)."""
    wanted = [set(e) for e in exts]
    shard, keys, offs, sizes = [np.zeros(0, dtype=np.int32)], [], [np.zeros((0, len(exts)), dtype=np.int64)], []
    sizes.append(offs[0])
    for i, (name, index_path, count) in enumerate(zip(names, index_paths, counts)):
        k, o, s = _shard_rows(index_path, name, count, wanted)
        shard.append(np.full(count, i, dtype=np.int32))
        keys += k
        offs.append(o)
        sizes.append(s)
    return np.concatenate(shard), keys, np.concatenate(offs), np.concatenate(sizes)


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
