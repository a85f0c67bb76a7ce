"""The data of every epoch: the shards (or a Mix's draw per epoch), how they are partitioned, this rank's plan.

The loader's first stage: what an epoch reads, before anything reads it. Under a
:class:`~feedfast.Mix` each epoch draws its own dataset (the last few draws are kept, behind a
lock: the producer and the caller both ask); otherwise every epoch reads the same shards.
Shuffled, the partition is one permutation of the whole dataset per epoch over local shards and
a block shuffle of windows of every shard over remote ones (:mod:`feedfast.order.block`);
unshuffled, each rank's contiguous range (:func:`~feedfast.order.deal.partition_for`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

from feedfast import _env
from feedfast.compile.plan import Plan
from feedfast.errors import UserError
from feedfast.loader.batchsize import check_batch_size, sample_bytes
from feedfast.loader.state import shard_set_digest
from feedfast.order.deal import EpochPlan, partition_for, plan_epoch
from feedfast.sources.dataset import ShardSet
from feedfast.sources.mixture import Dataset, mixed_epoch, open_dataset
from feedfast.spec.model import Spec


class EpochData:
    """The shards of each epoch and this rank's plan of it.

    Args:
        shards: what ``DataLoader(shards=...)`` was given (paths, globs, URLs, a Mix).
        spec: the settled spec (batch size, last batch, seed, shuffle).
        cache_dir: where indexes go when a shard's folder is read-only.
        open_kw: how the dataset is opened (pixel limit, remote cache limit, retries).
        rank, world: this rank and the world size.
    """

    def __init__(self, shards: Any, spec: Spec, cache_dir: Path, open_kw: dict[str, Any], *, rank: int,
                 world: int) -> None:
        self.spec, self.cache_dir, self.rank, self.world = spec, cache_dir, rank, world
        self._mixed: dict[int, ShardSet] = {}
        self._lock = threading.Lock()
        self._mix, base = open_dataset(shards, spec, cache_dir, **open_kw)
        self.shards: Dataset = self.shards_for(0) if self._mix else cast(Dataset, base)
        self.partition = partition_for(self.shards.read_kinds, shuffled=spec.shuffled)
        # what a state must match: no shard digest under a Mix, whose draw changes per epoch
        self.digest = None if self._mix else shard_set_digest(*self.shards.identity)

    def read_by_range(self) -> None:
        """The backend reads every shard by range itself: a shuffled epoch keeps the global order over shards
        whose kind reads single samples cheaply (:func:`~feedfast.order.deal.partition_for`)."""
        self.partition = partition_for(self.shards.read_kinds, shuffled=self.spec.shuffled, by_range=True)

    @property
    def mixed(self) -> bool:
        """Whether each epoch draws its own dataset (a Mix)."""
        return self._mix is not None

    def shards_for(self, epoch: int) -> Dataset:
        """The epoch's dataset: the shards, or under a Mix that epoch's draw."""
        if self._mix is None:
            return self.shards
        with self._lock:
            if epoch not in self._mixed:
                mix, sets = self._mix
                if len(self._mixed) > 2:
                    self._mixed.pop(min(self._mixed))
                self._mixed[epoch] = mixed_epoch(sets, mix, seed=self.spec.seed, epoch=epoch, cache_dir=self.cache_dir)
            return self._mixed[epoch]

    def plan(self, epoch: int, consumed: int = 0) -> EpochPlan:
        """This rank's plan of ``epoch``; ``consumed``: samples of its global order taken before an elastic resume."""
        spec = self.spec
        return plan_epoch(list(self.shards_for(epoch).sizes), batch_size=spec.batch_size, rank=self.rank,
                          world=self.world, last_batch=spec.last_batch, seed=spec.seed, epoch=epoch,
                          shuffle_shards=spec.shuffle_shards, partition=self.partition, consumed=consumed,
                          repeats=spec.repeats)

    def check_size(self, plan: Plan) -> None:
        """Refuse a batch size the data or the memory cannot hold (UserError saying what would fit)."""
        n, b, w = self.shards.total, self.spec.batch_size, self.world
        check_batch_size(b, samples=n, world=w, per_sample=sample_bytes(plan), memory=_env.physical_memory())
        if n < w:
            raise UserError(f"{n} samples cannot be split over {w} ranks: each rank needs at least one")
        if self.spec.last_batch == "drop" and n // w < b:
            raise UserError(f"drop_last with {n} samples over {w} ranks leaves no full batch of {b}: "
                            f"use a batch size <= {n // w} or last_batch='partial'")

    def build_row_index(self, plan: Plan) -> None:
        """The dataset's columnar index of rows (what a backend reading samples itself reads): built now, once
        per dataset (then opened in O(shards)), not at the first batch. A Mix builds its draws' as they come."""
        if self._mix is None:
            self.shards.row_index(plan.component_exts())
