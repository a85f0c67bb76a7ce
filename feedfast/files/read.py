"""A step's files read by path into one buffer: one C call, the GIL released (``feedfast._plan.read_files``).

Each file is opened relative to the listing's root (a folder descriptor held by the reader, so a path
is never joined in Python), checked to have the size it was listed with, read whole and closed. A file
missing, unreadable or of another size now is a :class:`~feedfast.errors.SampleError` naming the
listing's root and the file. Without the C extension the same reads run in Python, slower.
"""

from __future__ import annotations

import errno as errnos
import os
import weakref

import numpy as np

from feedfast.errors import SampleError
from feedfast.files.table import FileTable

try:
    from feedfast._plan import read_files as _read_files
except ImportError:  # the C extension is not built: the same reads in Python
    _read_files = None


class FileReader:
    """Reads a listing's files by index; holds its root folder open (closed when the reader goes)."""

    def __init__(self, table: FileTable) -> None:
        self.table = table
        try:
            self._root = os.open(table.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise SampleError("the listed folder cannot be opened", shard=table.root, key="",
                              reason=f"{exc.strerror}; list it again") from exc
        weakref.finalize(self, os.close, self._root)

    def read(self, indices: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Files ``indices`` end to end, and where each ends.

        Args:
            indices: int64 file numbers of the listing, in the order wanted.
            out: a uint8 buffer to read into, reused from step to step (made when None or too small).

        Returns:
            (data, ends): the files' bytes (a view of ``out``) and int64 [len(indices) + 1] bounds: file
            ``k`` is ``data[ends[k]:ends[k + 1]]``.

        Raises:
            SampleError: a file is missing, unreadable, or not the size it was listed with; names it.
        """
        indices = np.asarray(indices, dtype=np.int64)
        sizes = self.table.take("sizes", indices)
        unsized = np.flatnonzero(sizes < 0)
        if len(unsized):  # it could not be read when listed (a broken link): say why, as it is now
            self._fail(int(indices[unsized[0]]), self._errno_now(int(indices[unsized[0]])), -1)
        ends = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(sizes, out=ends[1:])
        if out is None or len(out) < ends[-1]:
            out = np.empty(int(ends[-1]), dtype=np.uint8)
        if _read_files is not None:
            blob, starts, lengths = self.table.path_bytes(indices)
            failed, error, found = _read_files(self._root, blob, starts, lengths, sizes, out)
        else:
            failed, error, found = self._read_python(indices, sizes, out)
        if failed >= 0:
            self._fail(int(indices[failed]), error, found)
        return out[: int(ends[-1])], ends

    def _read_python(self, indices: np.ndarray, sizes: np.ndarray, out: np.ndarray) -> tuple[int, int, int]:
        at = 0
        for k, (i, size) in enumerate(zip(indices.tolist(), sizes.tolist())):
            try:
                fd = os.open(os.fsencode(self.table.path(i)), os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._root)
            except OSError as exc:
                return k, exc.errno or errnos.EIO, 0
            try:
                now = os.fstat(fd).st_size
                if now != size:
                    return k, 0, now
                data = os.pread(fd, size, 0)
                if len(data) != size:
                    return k, 0, -1
                out[at: at + size] = np.frombuffer(data, dtype=np.uint8)
                at += size
            except OSError as exc:
                return k, exc.errno or errnos.EIO, -1
            finally:
                os.close(fd)
        return -1, 0, 0

    def _errno_now(self, i: int) -> int:
        try:
            os.stat(os.fsencode(self.table.path(i)), dir_fd=self._root)
        except OSError as exc:
            return exc.errno or errnos.EIO
        return 0

    def _fail(self, i: int, error: int, found: int) -> None:
        listed = int(self.table.take("sizes", np.array([i]))[0])
        if error:
            reason = f"{os.strerror(error)}"
        elif found >= 0 and listed >= 0:
            reason = f"it is {found} bytes now, {listed} when the folder was listed"
        else:
            reason = "it changed while it was read" if listed >= 0 else "it could not be read when listed"
        folder = os.path.dirname(self.table.full_path(i))
        raise SampleError("file cannot be read", shard=self.table.root, key=self.table.path(i),
                          reason=f"{reason}; restore it, or, if it was meant to change, have the folder listed "
                                 f"again: touch the folder it is in (`touch {folder}`), which invalidates the cached "
                                 "listing")
