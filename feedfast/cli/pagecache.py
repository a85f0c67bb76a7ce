"""Shard files and the page cache, for ``feedfast analyze``: stage in RAM, drop, check residency.

Nothing here needs root. Staging copies shards (and their indexes) into ``/dev/shm`` when it
is a big enough tmpfs, else into a temporary folder whose copies are then read once so the
page cache holds them. Dropping is ``fdatasync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)``
on each file, which the kernel honours for clean pages of any file the caller can open.
Residency is read with ``mincore(2)`` on a read-only mapping; since Linux 5.0 ``mincore``
reports page-cache pages only for files the caller owns or may write, so for other files
residency is ``None`` (unknown), never a guess.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedfast.errors import UserError

SHM = Path("/dev/shm")
_HEADROOM = 1.25
"""Staging in /dev/shm needs this many times the shards' bytes free there."""


@dataclass
class Staged:
    """Shard copies held in memory; remove them with :meth:`cleanup`.

    Attributes:
        folder: where the copies are.
        paths: the copied shard paths, in the given order.
        how: one line saying where and how the copies are held in memory.
        resident: the fraction of their bytes the page cache holds (None: unknown).
    """

    folder: Path
    paths: list[str]
    how: str
    resident: float | None = None
    _owned: bool = field(default=True, repr=False)

    def cleanup(self) -> None:
        """Delete the copies."""
        if self._owned:
            shutil.rmtree(self.folder, ignore_errors=False)
            self._owned = False


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_fraction(path: str) -> float | None:
    """The fraction of ``path``'s pages in the page cache, or None when it cannot be known.

    Unknown: the file is not ours and not writable (``mincore`` would only see our own
    mappings), or ``mincore`` failed (the reason is not raised: the answer is "unknown").
    """
    st = os.stat(path)
    if st.st_size == 0:
        return 1.0
    if st.st_uid != os.geteuid() and not os.access(path, os.W_OK):
        return None
    libc = _libc()
    page = mmap.PAGESIZE
    pages = -(-st.st_size // page)
    vec = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, st.st_size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            if libc.mincore(addr, st.st_size, vec) != 0:
                return None
        finally:
            libc.munmap(addr, st.st_size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec) / pages


def mean_resident(paths: Sequence[str]) -> float | None:
    """Byte-weighted resident fraction of several files (None if any is unknown)."""
    total = done = 0.0
    for p in paths:
        frac = resident_fraction(p)
        if frac is None:
            return None
        size = os.path.getsize(p)
        total += size
        done += frac * size
    return done / total if total else 1.0


def drop_cached(paths: Sequence[str]) -> dict[str, Any]:
    """Ask the kernel to evict ``paths`` from the page cache; report what stayed.

    Returns:
        ``method``, ``resident_before``, ``resident_after`` (fractions, None: unknown) and
        ``cold``: True when the files are known to be out of the cache (under 5 % resident).
    """
    before = mean_resident(paths)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    after = mean_resident(paths)
    return {"method": "fdatasync + posix_fadvise(POSIX_FADV_DONTNEED)", "resident_before": before,
            "resident_after": after, "cold": after is not None and after < 0.05}


def _shm_fits(nbytes: int) -> bool:
    if not SHM.is_dir() or not os.access(SHM, os.W_OK):
        return False
    return shutil.disk_usage(SHM).free > nbytes * _HEADROOM


def stage_in_memory(paths: Sequence[str], indexes: Sequence[str]) -> Staged:
    """Copy shards and their indexes into RAM (``/dev/shm``) or, failing that, the page cache.

    Args:
        paths: the shard files.
        indexes: each shard's index file, copied next to its copy (so it is not rebuilt).

    Raises:
        UserError: the copies do not fit in the temporary folder.
    """
    nbytes = sum(os.path.getsize(p) for p in paths)
    in_shm = _shm_fits(nbytes)
    folder = Path(tempfile.mkdtemp(prefix="feedfast-analyze-", dir=SHM if in_shm else None))
    try:
        out = _copy_all(paths, indexes, folder)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise UserError(f"cannot copy {nbytes / 1e6:.0f} MB of shards to {folder} for the cached run: {exc}") from exc
    if in_shm:
        how = f"copied to {folder} (tmpfs: held in RAM)"
    else:
        for p in out:
            _read_once(p)
        how = (f"copied to {folder} and read once into the page cache (/dev/shm missing or too small; "
               "the kernel may evict pages under memory pressure)")
    return Staged(folder, out, how, mean_resident(out))


def _copy_all(paths: Sequence[str], indexes: Sequence[str], folder: Path) -> list[str]:
    out = []
    for i, (shard, index) in enumerate(zip(paths, indexes, strict=True)):
        stem = f"{i:05d}-{Path(shard).name.removesuffix('.tar')}"
        dst = folder / f"{stem}.tar"
        shutil.copyfile(shard, dst)
        shutil.copyfile(index, folder / f"{stem}.idx")  # written after the tar: newer, so it is reused
        out.append(str(dst))
    return out


def _read_once(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
