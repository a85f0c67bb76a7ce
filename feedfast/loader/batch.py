"""What a batch is, from the backend that makes it to the user who gets it.

- :class:`Batch`: what every backend yields: host tensors and values, or :class:`Pending`
  outputs (a DALI pipeline's, still in DALI's memory, on the host or the GPU), with the
  samples it holds and the backend's state after it. A backend never moves a batch to the
  consumer's device: the delivery stage (:mod:`feedfast.loader.deliver`) does, for every backend.
- :class:`BatchInfo`: who is in a batch, given with it under ``sample_info=True``.
- :func:`shape_outputs`: the fields as the spec's outputs, a tuple or a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class Pending(Protocol):
    """An output a backend has not copied out of its own memory (a DALI pipeline's).

    The delivery stage gives it its destination: pinned staging for a host output, a device
    tensor for a device output (``on_device``), or, when batches are delivered to the CPU,
    :meth:`to_host` first. The backend's memory may be reused once :meth:`write` has returned
    and, for a device output, the copy it queued on ``stream`` has finished: the delivery stage
    waits for that before it asks the backend for the next batch.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    on_device: bool

    def write(self, out: torch.Tensor, stream: Any) -> torch.Tensor:
        """Copy into ``out`` (a device output: queued on ``stream``) and return the batch's rows of it."""
        ...

    def to_host(self) -> "Pending":
        """The same output copied to host memory (a GPU pipeline's output delivered to the CPU)."""
        ...


@dataclass
class Batch:
    """One batch as a backend yields it, before the delivery stage moves it to the consumer.

    Attributes:
        fields: each output by name: a host tensor (the delivery stage copies it to the
            consumer's device), a :class:`Pending` output, or a host value (strings, lists:
            delivered as they are).
        origins: each row's (shard, key): a list, or ``Origins`` read from the index when first asked for.
        valid: rows that are samples; the rest are padding (repeats of the rank's last sample).
        checkpoint: the backend's state after this batch when it took one (DALI's checkpoint), else None.
        lost: samples of this batch's step skipped while it was made, as (shard, key, reason): under
            ``on_error: skip``, those of a shard that could not be read mid-epoch (their rows are padding).
        before: the backend's state before this batch, where it ran on from earlier batches (DALI's life
            pipeline at an epoch's first batch: its checkpoint there), else None.
    """

    fields: dict[str, Any]
    origins: Sequence[tuple[str, str]]
    valid: int
    checkpoint: str | None = None
    lost: tuple[tuple[str, str, str], ...] = ()
    before: str | None = None


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


def shape_outputs(fields: dict[str, Any], outputs: Sequence[str], form: str, info: BatchInfo | None = None) -> Any:
    """The fields as the spec's outputs: a tuple in ``outputs`` order, or a dict (``form == "dict"``);
    ``info`` is the last element of the tuple, or the dict's ``"sample_info"``."""
    if form == "dict":
        out = {name: fields[name] for name in outputs}
        if info is not None:
            out["sample_info"] = info
        return out
    values = tuple(fields[name] for name in outputs)
    return values if info is None else (*values, info)


def batch_info(origins: Sequence[tuple[str, str]], valid: int, epoch: int, step: int,
               state: dict[str, Any]) -> BatchInfo:
    """The :class:`BatchInfo` of a batch of ``len(origins)`` rows whose first ``valid`` are samples."""
    mask = torch.zeros(len(origins), dtype=torch.bool)
    mask[:valid] = True
    return BatchInfo(tuple(origins), mask, epoch, step, state)
