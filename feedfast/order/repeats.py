"""Repeated augmentation (DeiT's ``RASampler``, timm's ``RepeatAugSampler``) over the global order: pure functions.

With ``shuffle.repeats: N`` an epoch reads the *repeated list* of the epoch's permutation,
each sample ``N`` times in a row (``[p0, p0, p0, p1, p1, p1, ...]`` for N = 3), and keeps the
dataset's length: its first ``total`` entries, so ``len(loader)`` and the steps of an epoch are
those of ``repeats: 1`` and about ``total / N`` distinct samples are read per epoch (DeiT's
choice; it also rounds down to a multiple of 256, which feedfast does not).

Entry ``j`` is copy ``j % N`` of sample ``perm(j // N)``. The global order's positions
(:mod:`feedfast.order.globalorder`) are dealt out in global batches of ``world * batch``, rank ``r``
taking the ``r``-th run of ``batch``; here each full global batch ``[s * W * B, (s + 1) * W * B)``
of positions is spread over the same stretch of entries by rank: the position of rank ``r``'s
``k``-th sample takes entry ``s * W * B + k * W + r`` (:func:`entry_of`). So rank ``r`` reads
the entries ``j`` with ``j % W == r`` in order, RASampler's ``indices[r::W]``, and the ``N``
consecutive copies of a sample land on ``N`` different ranks when ``N <= W`` (on
every rank in turn when ``N > W``). The last, incomplete global batch is read in entry order
(its copies may share a rank). Positions are counted from the resume cursor, so an elastic
resume (another world size or batch) deals the entries after the cursor with the new world:
every (sample, copy) of the epoch's first ``total`` entries is still read exactly once.

A copy's augmentation draws are keyed by ``sample + copy * total`` (:func:`draw_ids`): copy 0
draws as the sample does without repeats, and each further copy draws its own.

>>> entry_of(np.arange(8), 8, world=2, batch_size=2).tolist()
[0, 2, 1, 3, 4, 6, 5, 7]
"""

from __future__ import annotations

import numpy as np

from feedfast.order.permute import Permutation


def entry_of(positions: np.ndarray, remaining: int, *, world: int, batch_size: int) -> np.ndarray:
    """The repeated list's entries (counted from the cursor) read at global-order ``positions`` (likewise).

    A bijection of ``[0, remaining)``: each full global batch is spread over its own stretch by
    rank, the last, incomplete one is read as it is.
    """
    positions = np.asarray(positions, dtype=np.int64)
    step = world * batch_size
    full = (remaining // step) * step
    within = positions % step
    spread = positions - within + (within % batch_size) * world + within // batch_size
    return np.where(positions < full, spread, full + _tail_entry(positions - full, remaining - full, world))


def _tail_entry(t: np.ndarray, rest: int, world: int) -> np.ndarray:
    """The last, incomplete global batch spread likewise: rank ``r`` holds ``rank_range(rest, r, world)``; its
    ``k``-th sample takes entry ``k * world + r`` while every rank has a ``k``-th, then the extra samples some
    ranks hold take the last entries in rank order. A bijection of ``[0, rest)`` (``t`` outside it: anything)."""
    rounds = rest // world
    starts = np.arange(world + 1, dtype=np.int64) * rest // world
    rank = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, world - 1)
    k = t - starts[rank]
    return np.where(k < rounds, k * world + rank, rounds * world + starts[rank] - rank * rounds)


def repeated(entries: np.ndarray, perm: Permutation | None, repeats: int) -> tuple[np.ndarray, np.ndarray]:
    """The (sample, copy) of each entry of the repeated list: ``perm(entry // repeats)``, ``entry % repeats``."""
    entries = np.asarray(entries, dtype=np.int64)
    base = entries // repeats
    return (base if perm is None else perm(base)), entries % repeats


def draw_ids(samples: np.ndarray, copies: np.ndarray, total: int) -> np.ndarray:
    """The numbers a copy's draws are keyed by: ``sample + copy * total`` (copy 0: the sample's own)."""
    return np.asarray(samples, dtype=np.int64) + np.asarray(copies, dtype=np.int64) * total


def sample_of_id(ids: np.ndarray, total: int) -> np.ndarray:
    """The canonical sample of each draw id (:func:`draw_ids`' inverse, less the copy)."""
    return np.asarray(ids, dtype=np.int64) % total
