"""The reused buffers DALI's feed reads members into where it hands no views of mapped shards (a folder's files, a
shard past the maps allowed): a step a slot, written again only when DALI is done with it."""

from __future__ import annotations

import numpy as np


class Ring:
    """``slots`` reusable byte buffers per component, one a step (slot ``n % slots`` for the ``n``-th step fed),
    grown when a step needs more: a slot is written again ``slots`` steps after it was, when DALI and the
    read-ahead no longer hold it (``slots`` > DALI's queue + the read-ahead + 1)."""

    def __init__(self, components: int, slots: int) -> None:
        self.slots = slots
        self._buffers = [[np.empty(0, dtype=np.uint8) for _ in range(slots)] for _ in range(components)]

    def take(self, component: int, number: int, nbytes: int) -> np.ndarray:
        """The buffer of step ``number`` (of the steps fed, in order), at least ``nbytes`` long."""
        slot = number % self.slots
        buffer = self._buffers[component][slot]
        if len(buffer) < nbytes:
            buffer = self._buffers[component][slot] = np.empty(max(nbytes, len(buffer)) * 5 // 4, dtype=np.uint8)
        return buffer
