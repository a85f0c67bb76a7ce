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

    def path(self, i: int) -> str:
        """File ``i``'s path, relative to ``root`` (absolute where a file list gave it so)."""
        return os.fsdecode(self.paths[int(self.offsets[i]): int(self.offsets[i + 1])].tobytes())

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
