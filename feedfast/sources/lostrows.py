"""Under ``on_error: skip``, a shard that cannot be read mid-epoch: its rows are lost, counted, and made padding.

A remote shard is downloaded and checked when the dataset is opened; one the bounded shard cache
evicted is fetched again when the epoch reaches it, and its source may no longer serve it (or its
index may no longer match it). Under ``raise`` that read is an error naming the shard. Under
``skip`` (every backend: the readers of the CPU paths and DALI's feed keep one :class:`LostShards`
an epoch):

- the shard's rows are lost for the rest of the epoch, each named with the reason; the shard is not
  asked for again this epoch (the next epoch's reader asks its source again); one warning is logged;
- a batch keeps its shape (:func:`lost_last`): its samples first, its lost rows after them, filled
  with a copy of one of its samples, then its padding; the batch's ``valid`` counts its samples,
  so ``last_valid`` and ``BatchInfo.valid`` mark the lost rows as they mark padding.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Collection

from feedfast.errors import ShardError

log = logging.getLogger("feedfast.lostrows")

Read = Callable[[list[int]], list[list[Any]]]
"""Rows -> per component, each row's member (what a reader's ``members`` gives)."""


class LostShards:
    """The shards of one epoch's reader that could not be read mid-epoch, and the rows they lost (thread-safe).

    Args:
        names: the shards (paths or URLs), by shard number: named in the warning.
        shard_of: rows -> the shard of each (from the index's shard starts: no read).
        components: members per row.
    """

    def __init__(self, names: tuple[str, ...], shard_of: Callable[[list[int]], list[int]], components: int) -> None:
        self.names, self.shard_of, self.components = names, shard_of, components
        self.lost: dict[int, str] = {}  # row -> why its shard could not be read
        self.dead: dict[int, str] = {}  # shard -> the same reason: not asked for again
        self._lock = threading.Lock()

    def live(self, rows: list[int]) -> list[int]:
        """``rows`` less those of a shard found unreadable (what a read-ahead still asks for)."""
        if not self.dead:
            return rows
        return [r for r, s in zip(rows, self.shard_of(rows)) if s not in self.dead]

    def read(self, rows: list[int], read: Read) -> list[list[Any]]:
        """``read(rows)``; when it fails (or a shard of ``rows`` is already dead), ``rows`` read shard by shard:
        the members of a shard that cannot be read are None and its rows are in :attr:`lost`."""
        if self.dead and not self.dead.keys().isdisjoint(self.shard_of(rows)):
            return self._around(rows, read)
        try:
            return read(rows)
        except ShardError:
            return self._around(rows, read)

    def _around(self, rows: list[int], read: Read) -> list[list[Any]]:
        shards = self.shard_of(rows)
        out: list[list[Any]] = [[None] * len(rows) for _ in range(self.components)]
        for shard in sorted(set(shards)):
            at = [i for i, s in enumerate(shards) if s == shard]
            reason = self.dead.get(shard)
            if reason is None:
                try:
                    part = read([rows[i] for i in at])
                except ShardError as exc:
                    reason = self._died(shard, exc)
                else:
                    for c, column in enumerate(part):
                        for i, member in zip(at, column):
                            out[c][i] = member
                    continue
            with self._lock:
                for i in at:
                    self.lost[rows[i]] = reason
        return out

    def _died(self, shard: int, exc: ShardError) -> str:
        with self._lock:
            first = shard not in self.dead
            reason = self.dead.setdefault(shard, f"its shard could not be read mid-epoch: {exc}")
        if first:
            log.warning("on_error: skip: shard %r cannot be read; its samples are skipped for the rest of the epoch: "
                        "%s", self.names[shard], exc)
        return reason


def lost_last(n: int, valid: int, lost: Collection[int]) -> tuple[list[int], int | None, int]:
    """How a batch of ``n`` rows (its first ``valid`` samples) with rows ``lost`` (their shard could not be read,
    under ``on_error: skip``) is made whole: the row order that puts its samples first, then the lost rows,
    then the padding; the row that fills the lost ones (its first sample left; else a padding row that was
    read; None: none was); and the samples left, the batch's new ``valid``."""
    kept = [i for i in range(valid) if i not in lost]
    order = kept + [i for i in range(valid) if i in lost] + list(range(valid, n))
    fill = kept[0] if kept else next((i for i in range(valid, n) if i not in lost), None)
    return order, fill, len(kept)
