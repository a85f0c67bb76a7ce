"""A listing of files as arrays: what a folder or a file list holds, without a Python object per file.

Paths are relative to the listing's ``root`` (a file list's absolute lines stay absolute) and are kept
as the file system's bytes (``os.fsencode``), end to end in one ``uint8`` blob; file ``i``'s path is
``paths[offsets[i]:offsets[i + 1]]``. A cached listing's arrays are memory maps of its ``.npy`` files.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

try:
    from feedfast._plan import gather as _gather
    from feedfast._plan import read_packed as _read_packed
except ImportError:  # not built: the arrays are indexed through their maps
    _gather = _read_packed = None

_DESCRIPTORS: dict[tuple[int, str], int] = {}
"""A cached listing's files, opened once per process for :meth:`FileTable.take` (closed at exit)."""


def _descriptor(filename: str) -> int:
    key = (os.getpid(), filename)
    fd = _DESCRIPTORS.get(key)
    if fd is None:
        fd = _DESCRIPTORS.setdefault(key, os.open(filename, os.O_RDONLY | os.O_CLOEXEC))
    return fd


@dataclass(frozen=True)
class FileTable:
    """Files with their labels and sizes, as arrays (file ``i`` is row ``i`` of each).

    Attributes:
        root: the folder the paths are relative to (absolute).
        paths: uint8, every file's path (file system bytes) end to end.
        offsets: int64 [files + 1]: file ``i``'s path is ``paths[offsets[i]:offsets[i + 1]]``.
        labels: int64 [files]: each file's class index.
        sizes: int64 [files]: each file's size in bytes when listed; -1: it could not be read then
            (a broken link: torchvision lists it too, and reading it fails naming it).
        class_names: the classes in label order (a folder's class folders; empty for a file list).
        unreadable: folders the listing could not read, as (relative path, reason): left out, as
            ``os.walk`` leaves them out for torchvision (a warning names them).
    """

    root: str
    paths: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray
    sizes: np.ndarray
    class_names: tuple[str, ...] = ()
    unreadable: tuple[tuple[str, str], ...] = ()
    digest: str = ""
    """:meth:`content_digest`, kept with a cached listing (empty: not yet computed)."""
    summary: tuple[int, tuple[int, ...]] | None = None
    """(the listed files' bytes, each class's files), kept with a cached listing (None: count them): what would
    otherwise read every size and label of a large listing when it is loaded."""

    def counts(self) -> tuple[int, np.ndarray]:
        """The listed files' bytes (those read when listed) and each class's files."""
        if self.summary is not None:
            return self.summary[0], np.asarray(self.summary[1], dtype=np.int64)
        return int(self.sizes[self.sizes > 0].sum()), np.bincount(self.labels, minlength=len(self.class_names))

    def __len__(self) -> int:
        return len(self.labels)

    def content_digest(self) -> str:
        """A digest of what was listed: every path and label (what a loader state must match). Computed once, when
        the listing is kept: reading every array again would map a large listing whole into the process."""
        if self.digest:
            return self.digest
        h = hashlib.sha1(b"feedfast-folder/1")
        for array in (self.offsets, self.paths, self.labels):
            h.update(np.ascontiguousarray(array).data)
        return h.hexdigest()[:16]

    @property
    def classes(self) -> list[str]:
        """The class names in label order, as torchvision's ``ImageFolder.classes``."""
        return list(self.class_names)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as torchvision's ``ImageFolder.class_to_idx``."""
        return {name: i for i, name in enumerate(self.class_names)}

    @property
    def starts(self) -> np.ndarray:
        """int64 [files]: where each path starts in ``paths``."""
        return self.offsets[:-1]

    @property
    def lengths(self) -> np.ndarray:
        """int64 [files]: each path's length in bytes."""
        return np.diff(self.offsets)

    def take(self, field: str, indices: np.ndarray) -> np.ndarray:
        """``getattr(self, field)[indices]`` (``sizes``, ``labels`` or ``offsets``), read with ``pread`` where the
        array maps a cached listing's file: a batch's rows lie all over the listing, and touching them through
        the map maps their neighbours too (the kernel's fault-around, which ``MADV_RANDOM`` does not stop), so a
        few batches would map the whole listing into each process (at 1.28M files, 40 MB more a rank)."""
        array = getattr(self, field)
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        filename = getattr(array, "filename", None)
        if _gather is None or filename is None or array.ndim != 1 or not len(indices):
            return np.asarray(array[indices])
        if indices.min() < 0 or indices.max() >= len(array):
            raise IndexError(f"{field}: indices outside [0, {len(array)})")
        width = array.dtype.itemsize
        out = np.empty(len(indices), dtype=array.dtype)
        if not _gather(_descriptor(filename), int(array.offset) + indices * width, width, out.view(np.uint8)):
            return np.asarray(array[indices])  # the file changed under the map: read through it
        return out

    def path_bytes(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The paths of files ``indices`` end to end, in one new buffer: (blob, starts, lengths)."""
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        starts = self.take("offsets", indices)
        lengths = self.take("offsets", indices + 1) - starts
        packed = np.zeros(len(indices), dtype=np.int64)
        np.cumsum(lengths[:-1], out=packed[1:])
        blob = np.empty(int(lengths.sum()), dtype=np.uint8)
        filename = getattr(self.paths, "filename", None)
        if _read_packed is not None and filename is not None and len(indices):
            fds = np.full(len(indices), _descriptor(filename), dtype=np.int32)
            if _read_packed(fds, int(getattr(self.paths, "offset", 0)) + starts, lengths, blob) < 0:
                return blob, packed, lengths
        for i, (a, n) in enumerate(zip(starts.tolist(), lengths.tolist())):  # in memory, or the file changed
            blob[packed[i]: packed[i] + n] = self.paths[a: a + n]
        return blob, packed, lengths

    def path(self, i: int) -> str:
        """File ``i``'s path, relative to ``root`` (absolute where a file list gave it so)."""
        blob, _, _ = self.path_bytes(np.array([i], dtype=np.int64))
        return os.fsdecode(blob.tobytes())

    def full_path(self, i: int) -> str:
        """File ``i``'s path joined to ``root``."""
        return os.path.join(self.root, self.path(i))

    def samples(self) -> list[tuple[str, int]]:
        """Every (full path, label), as torchvision's ``ImageFolder.samples``: a Python object per file, for
        comparisons and small sets only."""
        return [(self.full_path(i), int(label)) for i, label in enumerate(self.labels.tolist())]


def pack(root: str, paths: Sequence[bytes], labels: Sequence[int] | np.ndarray, sizes: Sequence[int] | np.ndarray,
         class_names: Sequence[str] = (), unreadable: Sequence[tuple[str, str]] = ()) -> FileTable:
    """A :class:`FileTable` of these paths (file system bytes), labels and sizes."""
    offsets = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, paths), dtype=np.int64, count=len(paths)), out=offsets[1:])
    blob = np.frombuffer(b"".join(paths), dtype=np.uint8)
    return FileTable(root, blob, offsets, np.asarray(labels, dtype=np.int64), np.asarray(sizes, dtype=np.int64),
                     tuple(class_names), tuple(unreadable))
