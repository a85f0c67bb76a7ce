"""Local shards opened once each and read by offset: the one reader of the pil, threads and feed paths."""

from __future__ import annotations

import mmap
import os
import threading
from typing import Any, Sequence

from feedfast.errors import ShardError

MAX_MAPS = 4096
"""Shards mapped at once by one :class:`ShardFiles`, at most: each map is one of the process's memory maps (Linux
allows 65,530 by default, shared with malloc, CUDA and DALI); shards past it are read instead."""


class ShardFiles:
    """Descriptors of local shards, opened on first use and read with ``os.pread``.

    ``pread`` needs no seek, so one descriptor serves any number of threads. Pickling (a
    DataLoader worker process) carries the paths only: each process opens its own.

    Args:
        paths: the shards, by number.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(paths)
        self._fds: dict[int, int] = {}
        self._maps: dict[int, memoryview | None] = {}
        self._lock = threading.Lock()

    def read(self, shard: int, offset: int, size: int) -> bytes:
        """``size`` bytes of shard ``shard`` at ``offset``.

        Raises:
            ShardError: the shard cannot be opened or read, or ends before ``offset + size``.
        """
        path = self.paths[shard]
        try:
            data = os.pread(self._fd(shard), size, offset)
        except OSError as exc:
            raise ShardError(f"cannot read shard {path!r}: {exc}") from exc
        if len(data) != size:
            raise ShardError(f"shard is truncated: {path!r} ends before byte {offset + size}")
        return data

    def fds(self, shards: Any) -> Any:
        """The descriptor of each shard number in ``shards`` (an int array), opened where not yet: an int32 array."""
        import numpy as np

        numbers = np.asarray(shards)
        unique, inverse = np.unique(numbers, return_inverse=True)
        try:
            table = np.array([self._fd(int(s)) for s in unique.tolist()], dtype=np.int32)
        except OSError as exc:
            raise ShardError(f"cannot open a shard: {exc}") from exc
        return table[inverse]

    def mapped(self, shard: int) -> memoryview | None:
        """Shard ``shard`` mapped read-only, once until :meth:`close` (None where it cannot be mapped: an empty
        file, a file system without ``mmap``, more shards than :data:`MAX_MAPS`). Its length is the file's when
        mapped: a member past it is a cut shard, for the caller to refuse before touching it; a shard cut *while*
        mapped faults (``SIGBUS``) where read, as under DALI's own reader.

        Raises:
            ShardError: the shard cannot be opened.
        """
        if shard in self._maps:
            return self._maps[shard]
        if len(self._maps) >= MAX_MAPS:
            return None
        try:
            fd = self._fd(shard)
        except OSError as exc:
            raise ShardError(f"cannot open shard {self.paths[shard]!r}: {exc}") from exc
        try:
            view: memoryview | None = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
        except (OSError, ValueError):
            view = None
        with self._lock:  # the bound again: other threads may have mapped shards meanwhile
            if shard not in self._maps and len(self._maps) >= MAX_MAPS:
                return None  # this one is unmapped when its view goes
            return self._maps.setdefault(shard, view)

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:
            with self._lock:
                fd = self._fds.get(shard)
                if fd is None:
                    fd = self._fds[shard] = os.open(self.paths[shard], os.O_RDONLY)
        return fd

    def close(self) -> None:
        """Close every descriptor opened so far (reading again reopens) and drop the maps (each is unmapped when the
        last view of it, perhaps still held by DALI, goes)."""
        with self._lock:
            fds, self._fds = self._fds, {}
            self._maps = {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                continue

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["paths"])  # type: ignore[misc]
