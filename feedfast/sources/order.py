"""One global sample order per (seed, epoch), and how it is dealt out to ranks: pure functions.

With ``shuffle=True`` an epoch reads every sample of the dataset (all shards, in their
canonical concatenation: shard 0's indexed samples, then shard 1's, ...) in the order of a
random permutation fixed by (seed, epoch): :func:`epoch_permutation`, a function from position
to sample number evaluated per batch (:mod:`feedfast.sources.permute`), so an epoch's order
costs no memory whatever the dataset's size. Class-sorted shards give batches that are
statistically those of torch's ``RandomSampler``, which a shard shuffle plus a buffer shuffle
cannot (DALI #3088).

The order is dealt out in global batches (:func:`rank_positions`, or row by row
:func:`rank_position_of`): global step ``s`` takes
the next ``world * batch`` samples of the order, rank ``r`` the ``r``-th run of ``batch`` of
them. The last, incomplete global batch is split as evenly as possible (ranks ``r`` get
``rank_range(rest, r, world)``), and the last-batch policy then pads or drops as for any
rank (:mod:`feedfast.sources.assign`). So the samples consumed after ``s`` full steps are
exactly the first ``s * world * batch`` of the order, whatever the world size: a state is a
cursor into the order, and a run can resume at another world size or batch size with no
sample lost or repeated (and, with the same global batch, the same global sequence).

Example: 10 samples, order ``[7 2 9 0 4 1 8 3 6 5]``, 2 ranks, batch 2: step 0 gives rank 0
``[7 2]`` and rank 1 ``[9 0]``; step 1 ``[4 1]`` and ``[8 3]``; the rest ``[6 5]`` is split
into ``[6]`` and ``[5]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from feedfast.sources.assign import rank_range
from feedfast.sources.permute import Permutation, key_for
from feedfast.spec.model import SHUFFLE_BLOCK, SHUFFLE_WINDOW


def epoch_permutation(total: int, *, seed: int, epoch: int, shuffle: bool) -> Permutation | None:
    """The epoch's order as a function (position -> sample number), or None for the identity.

    A bijection of ``0..total-1`` fixed by (seed, epoch), the same on every machine
    (:mod:`feedfast.sources.permute`): O(1) memory, evaluated per batch.
    """
    return Permutation(total, key_for("feedfast-order", seed, epoch)) if shuffle else None


def epoch_order(total: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The whole epoch order as an array (8 bytes a sample: for tests and small sets; the loader
    evaluates :func:`epoch_permutation` per batch instead)."""
    positions = np.arange(total, dtype=np.int64)
    perm = epoch_permutation(total, seed=seed, epoch=epoch, shuffle=shuffle)
    return positions if perm is None else perm(positions)


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


def block_order(sizes: Sequence[int], *, rank: int, world: int, shuffle: BlockShuffle, seed: int,
                epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s samples of a block-shuffled epoch in reading order, and each one's window.

    1. Every shard is cut into windows of ``shuffle.window`` consecutive samples
       (:func:`shard_windows`), and the windows of all shards are permuted by (seed, epoch).
    2. Their samples, concatenated in that order, are cut into ``world`` contiguous ranges as
       DALI cuts shards (:func:`~feedfast.sources.assign.rank_range`): every sample once, and
       the ranks' counts are those of an unshuffled epoch (padding counted the same way).
    3. Inside the rank's range each window's samples are spread at random over about
       ``shuffle.block`` positions around the window's place (MosaicML Streaming's ``py1e``,
       over windows instead of whole shards): each sample's key is its place plus a uniform
       shift in ``±(block - len) / 2``, clipped to the range, and the samples are read in key
       order. At any point about ``block / window`` windows, from as many shards, are being read.

    Deterministic for (seed, epoch, rank, world). Returns canonical sample numbers (shard 0's
    samples first) and window numbers (into :func:`shard_windows`' list).
    """
    starts, lengths = shard_windows(sizes, shuffle.window)
    perm = _rng("feedfast-blocks", seed, epoch).permutation(len(starts))
    lens = lengths[perm]
    total = int(lens.sum())
    seq = np.repeat(starts[perm] - (np.cumsum(lens) - lens), lens) + np.arange(total, dtype=np.int64)
    wid = np.repeat(perm, lens)
    lo, hi = rank_range(total, rank, world)
    mine, windows, n = seq[lo:hi], wid[lo:hi], hi - lo
    run_start = np.flatnonzero(np.diff(windows, prepend=-1))  # a window cut by the range edges is a shorter run
    run_len = np.diff(np.append(run_start, n))
    cut = np.maximum(0.0, (shuffle.block - run_len) / 2)
    low, high = np.maximum(-cut, -run_start), np.minimum(cut, n - run_start - run_len)
    u = _rng("feedfast-blocks", seed, epoch, rank, world).random(n)
    keys = np.arange(n) + np.repeat(low, run_len) + u * np.repeat(high - low, run_len)
    read = np.argsort(keys, kind="stable")
    return mine[read], windows[read]
