"""A listing's rows and bytes as the CPU paths read a dataset's: the index and the member reader of a folder.

:class:`FolderIndex` answers what :class:`~feedfast.shards.index.columnar.ColumnarIndex` answers
(``take`` -> :class:`~feedfast.shards.index.columnar.RowBatch`, ``shard_of``, ``keys``), from the
listing's arrays: every sample is in shard 0 (the folder), a component's size is the file's size
(``file``) or its label's digits (``label``), and a key is the file's path relative to the folder.
:class:`FolderMembers` answers what :class:`~feedfast.sources.members.ShardMembers` answers: a
chunk's bytes per component, the files read in one call with the GIL released
(:class:`~feedfast.files.read.FileReader`), a label as the ASCII digits the ``label`` op parses.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from feedfast.errors import SampleError
from feedfast.files.read import FileReader
from feedfast.files.table import FileTable
from feedfast.shards.index.columnar import RowBatch
from feedfast.sources.members import Buffer, StepBytes


class FolderIndex:
    """The listing's samples as rows of one shard (see the module docstring); picklable with its listing."""

    def __init__(self, table: FileTable, roles: tuple[str, ...]) -> None:
        self.table, self.roles = table, roles
        self.components = len(roles)
        self.starts = np.array([0, len(table)], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.table)

    def shard_of(self, samples: np.ndarray) -> np.ndarray:
        """Shard 0, the folder, for every sample."""
        return np.zeros(len(np.asarray(samples)), dtype=np.int32)

    def take(self, samples: Sequence[int] | np.ndarray) -> RowBatch:
        """The rows of ``samples`` (file numbers): offset 0, each component's size, the path as the key."""
        samples = np.asarray(samples, dtype=np.int64)
        if len(samples) and (samples.min() < 0 or samples.max() >= len(self)):
            raise IndexError(f"sample numbers outside [0, {len(self)})")
        sizes = np.empty((len(samples), self.components), dtype=np.int64)
        for c, role in enumerate(self.roles):
            if role == "file":
                sizes[:, c] = self.table.take("sizes", samples)
            else:  # the label's ASCII digits
                sizes[:, c] = ascii_labels(self.table.take("labels", samples)).sizes
        offsets = np.zeros_like(sizes)
        key_at = self.table.take("offsets", samples)
        key_len = self.table.take("offsets", samples + 1) - key_at
        return RowBatch(samples, self.shard_of(samples), offsets, sizes, key_at, key_len)

    def key(self, sample: int) -> str:
        """File ``sample``'s path relative to the folder."""
        return self.table.path(sample)

    def keys(self, samples: Sequence[int] | np.ndarray) -> list[str]:
        """The paths of ``samples``, relative to the folder."""
        blob, starts, lengths = self.table.path_bytes(np.asarray(samples, dtype=np.int64))
        data = blob.tobytes()
        return [os.fsdecode(data[a: a + n]) for a, n in zip(starts.tolist(), lengths.tolist())]

    def batch_keys(self, rows: RowBatch) -> list[str]:
        """The keys of a batch already taken."""
        return self.keys(rows.samples)


class FolderMembers:
    """A chunk's bytes per component, read from the listing's files (see the module docstring).

    Pickling (a ``pil`` worker process) carries the listing: each process opens the folder itself.
    """

    def __init__(self, table: FileTable, roles: tuple[str, ...]) -> None:
        self.table, self.roles = table, roles
        self._reader: FileReader | None = None

    @property
    def reader(self) -> FileReader:
        """The folder's reader, opened on first use (in the process that reads)."""
        if self._reader is None:
            self._reader = FileReader(self.table)
        return self._reader

    def chunk(self, rows: RowBatch, a: int, b: int) -> list[list[bytes | memoryview | None]]:
        """Rows ``a .. b``'s bytes per component: the files in one read (memoryviews of one buffer), None for a
        file that cannot be read (:meth:`sample` says why)."""
        ids = np.asarray(rows.samples[a:b], dtype=np.int64)
        out: list[list[bytes | memoryview | None]] = []
        files: list[bytes | memoryview | None] | None = None
        for role in self.roles:
            if role == "label":
                out.append([str(v).encode() for v in self.table.take("labels", ids).tolist()])
                continue
            if files is None:
                files = self._files(ids)
            out.append(files)
        return out

    def _files(self, ids: np.ndarray) -> list[bytes | memoryview | None]:
        try:
            data, ends = self.reader.read(ids)
        except SampleError:  # one file fails: the others one by one, the failing one None
            return [self._one(int(i)) for i in ids.tolist()]
        view, bounds = data.data, ends.tolist()
        return [view[s:e] for s, e in zip(bounds[:-1], bounds[1:])]

    def _one(self, i: int) -> bytes | None:
        try:
            data, _ = self.reader.read(np.array([i], dtype=np.int64))
        except SampleError:
            return None
        return data.tobytes()

    def packed(self, rows: RowBatch, component: int, buffer: Buffer) -> tuple[StepBytes, int]:
        """The rows' files end to end in ``buffer(nbytes)``, read in one call with the GIL released, or their labels
        as ASCII digits (a new buffer); never a failed row: a file that cannot be read raises.

        Raises:
            SampleError: a file is missing, unreadable or changed since the listing; names folder and file.
        """
        ids = np.asarray(rows.samples, dtype=np.int64)
        if self.roles[component] == "label":
            return ascii_labels(self.table.take("labels", ids)), -1
        sizes = self.table.take("sizes", ids)
        out = buffer(int(np.maximum(sizes, 0).sum()))
        data, ends = self.reader.read(ids, out=out)
        return StepBytes(data, ends[:-1].copy(), np.diff(ends)), -1

    def mapped(self, rows: RowBatch, component: int) -> None:
        """None: a folder's files are read into the feed's ring (``packed``); a map of each file would have to be
        held, file by file, until DALI is done with it."""
        return None

    def sample(self, rows: RowBatch, i: int) -> list[bytes]:
        """Row ``i``'s bytes per component.

        Raises:
            SampleError: its file is missing, unreadable or changed since the listing; names folder and file.
        """
        number = int(rows.samples[i])
        out = []
        for role in self.roles:
            if role == "label":
                out.append(str(int(self.table.take("labels", np.array([number]))[0])).encode())
            else:
                data, _ = self.reader.read(np.array([number], dtype=np.int64))
                out.append(data.tobytes())
        return out

    def close(self) -> None:
        """Nothing to close: the folder's descriptor closes with the reader."""

    def __getstate__(self) -> dict[str, Any]:
        return {"table": self.table, "roles": self.roles}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["table"], state["roles"])  # type: ignore[misc]


def ascii_labels(labels: np.ndarray) -> StepBytes:
    """Integer labels as the ASCII digits a ``.cls`` member holds (a ``-`` first where negative), end to end: what
    the ``label`` op parses, made a batch at a time."""
    values = np.asarray(labels, dtype=np.int64)
    magnitude = np.abs(values)
    digits = np.ones(len(values), dtype=np.int64)
    bound = np.int64(10)
    while (magnitude >= bound).any():  # at most 19 rounds for int64
        digits += magnitude >= bound
        if bound > np.iinfo(np.int64).max // 10:
            break
        bound *= 10
    sizes = digits + (values < 0)
    starts = np.zeros(len(values), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    data = np.empty(int(sizes.sum()), dtype=np.uint8)
    data[starts[values < 0]] = ord("-")
    ends = starts + sizes
    rest = magnitude.copy()
    for k in range(int(digits.max()) if len(values) else 0):  # the k-th digit from the right of each label
        has = digits > k
        data[(ends - 1 - k)[has]] = ord("0") + (rest[has] % 10)
        rest //= 10
    return StepBytes(data, starts, sizes)
