"""How the CPU paths read a chunk's bytes, whatever the dataset: one small interface, one reader per kind.

:class:`Members` is what the ``threads`` and ``pil`` backends hold: per component, the bytes of a
chunk of rows (``chunk``, the GIL released inside) or of one row (``sample``, the per-sample way,
which raises what is wrong). A dataset gives its own (``dataset.members(exts)``):
:class:`ShardMembers` reads local shards at their index's offsets;
:class:`~feedfast.sources.folderindex.FolderMembers` reads a listing's files by path.
Remote shards are read ahead by range instead (:mod:`feedfast.sources.rangeread`).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from feedfast.errors import ShardError
from feedfast.shards.index.columnar import RowBatch
from feedfast.shards.transport.shardfiles import ShardFiles

try:
    from feedfast._plan import read_batch as _read_batch
except ImportError:  # not built: the same reads in Python
    _read_batch = None


class Members(Protocol):
    """A dataset's member bytes, per component, by row."""

    def chunk(self, rows: RowBatch, a: int, b: int) -> Sequence[Sequence[bytes | memoryview | None]]:
        """Rows ``a .. b``'s bytes per component; None where a read fails (``sample`` raises why)."""
        ...

    def sample(self, rows: RowBatch, i: int) -> list[bytes]:
        """Row ``i``'s bytes per component (``b""`` where it has no such member); raises what is wrong."""
        ...

    def close(self) -> None:
        """Release what reading opened (reading again reopens)."""
        ...


class ShardMembers:
    """Local shards' members at their index's offsets (:class:`~feedfast.shards.transport.shardfiles.ShardFiles`)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.files = ShardFiles(paths)  # pickled as paths: each worker process opens its own

    def chunk(self, rows: RowBatch, a: int, b: int) -> list[list[bytes | None]]:
        """Each component's members of rows ``a .. b``, one ``pread`` each, the GIL released (``_plan``)."""
        if _read_batch is None:
            return [[self._member(rows, i, c) for i in range(a, b)] for c in range(rows.offsets.shape[1])]
        fds = np.ascontiguousarray(self.files.fds(rows.shard[a:b]), dtype=np.int32)
        return [_read_batch(fds, np.ascontiguousarray(rows.offsets[a:b, c], dtype=np.int64),
                            np.ascontiguousarray(rows.sizes[a:b, c], dtype=np.int64))
                for c in range(rows.offsets.shape[1])]

    def sample(self, rows: RowBatch, i: int) -> list[bytes]:
        """Row ``i``'s members (``b""`` where it has none).

        Raises:
            ShardError: the shard cannot be read, or ends before a member.
        """
        number = int(rows.shard[i])
        return [b"" if size < 0 else self.files.read(number, off, size)
                for off, size in zip(np.asarray(rows.offsets[i]).tolist(), np.asarray(rows.sizes[i]).tolist())]

    def _member(self, rows: RowBatch, i: int, c: int) -> bytes | None:
        size = int(rows.sizes[i, c])
        if size < 0:
            return None
        try:
            return self.files.read(int(rows.shard[i]), int(rows.offsets[i, c]), size)
        except ShardError:
            return None

    def close(self) -> None:
        """Close the shards opened so far."""
        self.files.close()
