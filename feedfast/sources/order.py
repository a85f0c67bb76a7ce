"""One global sample order per (seed, epoch), and how it is dealt out to ranks: pure functions.

With ``shuffle=True`` an epoch reads every sample of the dataset (all shards, in their
canonical concatenation: shard 0's indexed samples, then shard 1's, ...) in the order of a
uniform random permutation fixed by (seed, epoch): :func:`epoch_order`. Class-sorted shards
give batches that are statistically those of torch's ``RandomSampler``, which a shard shuffle
plus a buffer shuffle cannot (DALI #3088).

The order is dealt out in global batches (:func:`rank_positions`): global step ``s`` takes
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

import numpy as np

from feedfast.sources.assign import rank_range


def epoch_order(total: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The epoch's order of sample numbers ``0..total-1``: a uniform permutation, or the identity.

    Deterministic for (seed, epoch) on every machine (numpy's PCG64 from a SHA-256 of both).
    Memory: 8 bytes a sample (80 MB for ten million).
    """
    if not shuffle:
        return np.arange(total, dtype=np.int64)
    digest = hashlib.sha256(f"feedfast-order/{seed}/{epoch}".encode()).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))
    return rng.permutation(total).astype(np.int64)


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
