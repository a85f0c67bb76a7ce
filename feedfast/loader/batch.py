"""What a batch holds, carried by the batch itself: sample origins, the padding mask, the state after it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch


@dataclass(frozen=True)
class BatchInfo:
    """Who is in one batch, tied to that batch (not to the loader's latest state).

    Given with every batch by ``DataLoader(..., sample_info=True)``: as the last element of a
    tuple batch, or under the key ``"sample_info"`` of a dict batch. A consumer that fetches
    batches ahead (a prefetching wrapper, Lightning) still reads the right identity and the
    right resume point for the batch it trains on.

    Attributes:
        origins: each row's (shard, sample key), padding rows included.
        valid: bool tensor, one entry per row: False for a padded (repeated) row.
        epoch, step: the epoch, and this batch's step in it (0-based).
        state: ``DataLoader.state_dict()`` as it is right after this batch: load it to resume
            with the batch after this one.
    """

    origins: tuple[tuple[str, str], ...]
    valid: torch.Tensor
    epoch: int
    step: int
    state: dict[str, Any]

    def to(self, device: Any, non_blocking: bool = False) -> "BatchInfo":
        """The same info with ``valid`` on ``device`` (what Lightning and other batch movers call)."""
        return replace(self, valid=self.valid.to(device, non_blocking=non_blocking))

    @property
    def keys(self) -> list[str]:
        """Each row's sample key."""
        return [key for _, key in self.origins]

    @property
    def shards(self) -> list[str]:
        """Each row's shard."""
        return [shard for shard, _ in self.origins]
