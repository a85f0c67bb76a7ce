"""The ``global`` partition's order: the epoch's permutation of every sample, dealt out in global batches.

With ``shuffle=True`` an epoch reads every sample of the dataset (all shards, in their
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

import numpy as np

from feedfast.order.deal import EpochPlan, rank_position_of
from feedfast.order.permute import Permutation, key_for
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



class GlobalOrder:
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
