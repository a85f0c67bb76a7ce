"""A rank's reading order of an epoch, as a function of rows, by the epoch plan's partition, and its rows.

:func:`order_for` picks it, each partition's order in a module of its own: the global permutation dealt out in
global batches (``global``, :mod:`feedfast.order.globalorder`), the block shuffle of windows (``block``,
:mod:`feedfast.order.block`), or the rank's contiguous range of the shards in the epoch's order, permuted, in
windows or as it is (``shards``, :mod:`feedfast.order.shardrange`). Each is a pure function of (seed, epoch,
rank, world) and the rows asked for; nothing is held per sample. :func:`epoch_rows` puts the order over the
dataset's index (:class:`~feedfast.order.rows.Rows`, which maps its samples to shards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from feedfast.order.block import BlockOrder, BlockShuffle
from feedfast.order.deal import EpochPlan, rank_counts, rank_range
from feedfast.order.globalorder import GlobalOrder
from feedfast.order.permute import key_for
from feedfast.order.rows import Dataset, Rows
from feedfast.order.shardrange import RangeOrder, ShuffledRange, WindowShuffle


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
        return Order(count, GlobalOrder(total, remaining, ep, rank=rank, world=world, seed=seed, epoch=epoch,
                                        shuffle=shuffle), copies_of=total if ep.repeats > 1 else 0)
    if ep.partition == "block":
        blocks = BlockOrder(sizes, rank=rank, world=world, shuffle=block or BlockShuffle(), seed=seed, epoch=epoch)
        return Order(blocks.count, blocks, blocks)
    lo, hi = rank_range(total, rank, world)
    ranged = RangeOrder(sizes, ep.shard_order, lo)
    if window > 0:
        shuffled = WindowShuffle(ranged, hi - lo, window, key_for("feedfast-windows", seed, epoch, rank))
        return Order(hi - lo, shuffled, shuffled)
    if shuffle:
        return Order(hi - lo, ShuffledRange(ranged, hi - lo, key_for("feedfast-range", seed, epoch, rank)))
    return Order(hi - lo, ranged)


def epoch_rows(shards: Dataset, exts: Sequence[set[str] | frozenset[str]], ep: EpochPlan, *, rank: int, world: int,
               seed: int, epoch: int, shuffle: bool, window: int = 0,
               block: BlockShuffle | None = None) -> Rows:
    """This rank's rows of the epoch ``ep`` plans (see the module docstring).

    Args:
        shards: the dataset: its sample counts per shard and its index of rows (:class:`~feedfast.order.rows.Dataset`).
        exts: each component's extensions.
        ep: the rank's epoch plan (its partition, shard order, samples consumed before a resume).
        shuffle: whether the epoch is shuffled (``global``: a permutation, not the identity;
            ``shards``: the rank's range permuted).
        window: under ``shards``, shuffle the range in windows of this many samples (stream transport).
        block: the block shuffle's sizes, for ``block``.
    """
    sizes = shards.sizes
    order = order_for(sizes, ep, rank=rank, world=world, seed=seed, epoch=epoch, shuffle=shuffle, window=window,
                      block=block)
    return Rows(shards.row_index(exts), order.count, order.sample_of, order.window, order.copies_of)
