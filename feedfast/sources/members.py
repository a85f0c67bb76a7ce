"""How the CPU paths read a chunk's bytes, whatever the dataset: one small interface, one reader per kind.

:class:`Members` is what the ``threads`` and ``pil`` backends hold: per component, the bytes of a
chunk of rows (``chunk``, the GIL released inside) or of one row (``sample``, the per-sample way,
which raises what is wrong); DALI's feed takes a step's members of a component end to end in one
buffer (``packed``, a :class:`StepBytes`). A dataset gives its own (``dataset.members(exts)``):
:class:`ShardMembers` reads local shards at their index's offsets;
:class:`~feedfast.sources.folderindex.FolderMembers` reads a listing's files by path.
Remote shards are read ahead by range instead (:mod:`feedfast.sources.rangeread`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from feedfast.shards.index.columnar import RowBatch
from feedfast.shards.transport.shardfiles import ShardFiles
from feedfast.sources.memberread import EMPTY, MISSING

try:
    from feedfast._plan import read_batch as _read_batch
    from feedfast._plan import read_packed as _read_packed
except ImportError:  # not built: members are read one by one (``sample``); ``chunk`` and ``packed`` are not used
    _read_batch = _read_packed = None

Buffer = Callable[[int], np.ndarray]
"""``nbytes -> a uint8 buffer of at least that many bytes`` (a reused ring's slot, or a new array)."""


@dataclass
class StepBytes:
    """One step's members of one component, end to end in ``data``: member ``i`` is
    ``data[starts[i] : starts[i] + max(sizes[i], 0)]``; a size of -1 is no such member."""

    data: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray

    def member(self, i: int) -> np.ndarray:
        """Member ``i`` as a view of ``data`` (empty for none)."""
        start = int(self.starts[i])
        return self.data[start:start + max(int(self.sizes[i]), 0)]

    def views(self) -> list[np.ndarray]:
        """Each member as a view of ``data`` (an empty array for none)."""
        return self._slices(self.data)

    def buffers(self) -> list[Any]:
        """Each member as a memoryview of ``data`` (as :meth:`views`, cheaper to make and to hand to DALI's
        ``TensorCPU``, which shares either: view, tensor and list 1.25 to 1.30 us a member, against 1.35 to 1.39
        with NumPy views)."""
        return self._slices(memoryview(self.data))  # type: ignore[arg-type]

    def _slices(self, whole: Any) -> list[Any]:
        ends = (self.starts + np.maximum(self.sizes, 0)).tolist()
        return _marked([whole[a:b] for a, b in zip(self.starts.tolist(), ends)], self.sizes)


def _marked(members: list[Any], sizes: np.ndarray) -> list[Any]:
    """``members`` with each of size 0 made :data:`EMPTY` and each of size -1 (none) :data:`MISSING`."""
    for i in np.flatnonzero(sizes <= 0).tolist():
        members[i] = MISSING if sizes[i] < 0 else EMPTY
    return members


def _packing(sizes: np.ndarray, buffer: Buffer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Members of ``sizes`` end to end: (their sizes as int64, their starts, the buffer they go in)."""
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    lengths = np.maximum(sizes, 0)
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return sizes, starts, buffer(int(starts[-1] + lengths[-1]) if len(sizes) else 0)


def read_members(fds: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> list[bytes | None]:
    """Each member's bytes (``pread`` of ``sizes`` at ``offsets`` of ``fds``, the GIL released), None where the read
    fails or is short."""
    assert _read_batch is not None  # read only where the extension is built
    got: list[bytes | None] = _read_batch(np.ascontiguousarray(fds, dtype=np.int32),
                                          np.ascontiguousarray(offsets, dtype=np.int64),
                                          np.ascontiguousarray(sizes, dtype=np.int64))
    return got


class Members(Protocol):
    """A dataset's member bytes, per component, by row."""

    def chunk(self, rows: RowBatch, a: int, b: int) -> Sequence[Sequence[bytes | memoryview | None]]:
        """Rows ``a .. b``'s bytes per component; None where a read fails (``sample`` raises why)."""
        ...

    def sample(self, rows: RowBatch, i: int) -> list[bytes]:
        """Row ``i``'s bytes per component (``b""`` where it has no such member); raises what is wrong."""
        ...

    def packed(self, rows: RowBatch, component: int, buffer: Buffer) -> tuple[StepBytes, int]:
        """The rows' members of ``component`` end to end in one buffer (``buffer(nbytes)``), read in one call with
        the GIL released (DALI's feed); and the first row whose read failed (``sample`` says why), else -1."""
        ...

    def mapped(self, rows: RowBatch, component: int) -> list[Any] | None:
        """The rows' members of ``component`` as views of memory that stays valid until :meth:`close` (DALI's feed
        hands them over as they are: no read, no copy); None where this reader cannot (then ``packed``)."""
        ...

    def close(self) -> None:
        """Release what reading opened (reading again reopens)."""
        ...


class ShardMembers:
    """Local shards' members at their index's offsets (:class:`~feedfast.shards.transport.shardfiles.ShardFiles`)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.files = ShardFiles(paths)  # pickled as paths: each worker process opens its own

    def chunk(self, rows: RowBatch, a: int, b: int) -> list[list[bytes | None]]:
        """Each component's members of rows ``a .. b``, one ``pread`` each, the GIL released (the threaded path's
        planned reads, which run only where ``_plan`` is built)."""
        fds = self.files.fds(rows.shard[a:b])
        return [read_members(fds, rows.offsets[a:b, c], rows.sizes[a:b, c]) for c in range(rows.offsets.shape[1])]

    def sample(self, rows: RowBatch, i: int) -> list[bytes]:
        """Row ``i``'s members (``b""`` where it has none).

        Raises:
            ShardError: the shard cannot be read, or ends before a member.
        """
        number = int(rows.shard[i])
        return [b"" if size < 0 else self.files.read(number, off, size)
                for off, size in zip(np.asarray(rows.offsets[i]).tolist(), np.asarray(rows.sizes[i]).tolist())]

    def packed(self, rows: RowBatch, component: int, buffer: Buffer) -> tuple[StepBytes, int]:
        """The rows' members of ``component`` end to end (``pread`` of each, ``_plan.read_packed``)."""
        sizes, starts, data = _packing(rows.sizes[:, component], buffer)
        fds = np.ascontiguousarray(self.files.fds(rows.shard), dtype=np.int32)
        assert _read_packed is not None  # the feed reads packed only where the extension is built
        failed = _read_packed(fds, np.ascontiguousarray(rows.offsets[:, component]), sizes, data)
        return StepBytes(data, starts, sizes), int(failed)

    def mapped(self, rows: RowBatch, component: int) -> list[Any] | None:
        """The rows' members of ``component`` as views of their shards mapped read-only
        (:meth:`ShardFiles.mapped`), as DALI's own reader hands its decoder a shard's bytes; None where a shard
        cannot be mapped or a member lies past its end (a cut shard: ``packed`` then names it)."""
        unique, at = np.unique(rows.shard, return_inverse=True)
        maps = [self.files.mapped(s) for s in unique.tolist()]
        if any(m is None for m in maps):
            return None
        sizes = rows.sizes[:, component]
        offsets, lengths = rows.offsets[:, component], np.maximum(sizes, 0)
        if np.any(offsets + lengths > np.array([len(m) for m in maps])[at]):  # type: ignore[arg-type]
            return None
        return _marked([maps[s][a:a + n]  # type: ignore[index]
                        for s, a, n in zip(at.tolist(), offsets.tolist(), lengths.tolist())], sizes)

    def close(self) -> None:
        """Close the shards opened so far."""
        self.files.close()
