"""A local cache of whole remote shards, bounded in size, least recently used out first.

``pipe:`` shards cannot be read at an offset, so they are downloaded whole (streaming, to a
temporary file renamed into place) as ``<cache_dir>/shards/<sha1(url)>.tar`` and read from
there; so are http(s) shards under ``on_error: skip``, whose images must be checked locally.

A shard is renamed into place only when its download is whole: a transport's stream ends
only at the shard's end (an http body shorter than its ``Content-Length``, an object shorter
than its size, is an error, retried from the start), so a dropped connection never leaves a
short shard in the cache, and a later run downloads it again. A cached shard is trusted as
long as it is there: a ``pipe:`` command is assumed to give the same bytes every time
(delete the folder to refresh; a cut tar it gave is named as damaged when it is indexed). Every use stamps the file's
access time, and after each download the least recently used shards are deleted until
the folder holds at most ``limit`` bytes (``None``: no limit, the default). The shard just
downloaded is never deleted, so one shard larger than the limit still works. A shard
deleted while a reader needs it is downloaded again; a reader that already opened it keeps
reading the deleted file. A shard evicted that cannot be downloaded again (its source is gone)
is a RemoteError saying so, naming the URL: under ``raise`` the read that needed it fails; under ``skip``
its reader loses the shard's rows for the rest of the epoch (:mod:`.lostrows`). Concurrent downloads of one
URL are serialized with a lock file.

The cache is itself a :class:`~feedfast.shards.transport.transport.Transport` that wraps whichever
transport reads the URL: its reads (``stream``, ``read_range``) are of the cached copy.
``read_range`` keeps the last :data:`OPEN` copies it read open (a shuffled epoch over cached
shards reads sample by sample: 28 us a read reopening the file, 3 us on a kept descriptor); a
kept copy is stamped when it is opened, and read on even if it is evicted meanwhile.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, TypeVar

from feedfast.errors import ShardError
from feedfast.shards.transport import schemes
from feedfast.shards.transport.remote import DEFAULT_TRANSFER, RemoteError, Transfer
from feedfast.shards.transport.transport import Transport, transport_for

T = TypeVar("T")
OPEN = 64
"""Cached copies ``read_range`` keeps open at most (the least recently opened is let go first)."""


@dataclass(frozen=True)
class ShardCache(Transport):
    """Whole remote shards kept under ``root``, at most ``limit`` bytes of them (None: unlimited)."""

    root: str
    limit: int | None = None
    transfer: Transfer = DEFAULT_TRANSFER
    kind: schemes.Kind = field(default=schemes.CACHE, init=False, repr=False)
    _open: dict[str, "_Descriptor"] = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "limit": self.limit, "transfer": self.transfer}  # a process opens its own copies

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def path_for(self, url: str) -> Path:
        """Where ``url`` is (or will be) cached."""
        return Path(self.root) / f"{hashlib.sha1(url.encode()).hexdigest()[:24]}.tar"

    def ensure(self, url: str) -> Path:
        """The cached copy of ``url``, downloaded first if it is not there.

        Raises:
            ShardError: the shard cannot be downloaded (names the URL) or the cache
                folder cannot be written.
        """
        path = self.path_for(url)
        if _touch(path):
            return path
        evicted = path.with_suffix(".evicted").exists()  # left by evict(); a failed first download leaves none
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path.with_suffix(".lock"), "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not _touch(path):  # another process may have finished it meanwhile
                    self._download(url, path)
        except RemoteError as exc:
            if not evicted:
                raise
            raise RemoteError(f"shard {url!r} was evicted from the shard cache ({self.root}, limit "
                              f"{self.limit} bytes) and cannot be fetched again: {exc}; its samples cannot be read "
                              "(raise cache_limit so the shards fit, or make the source serve it again)",
                              url=url, status=exc.status) from exc
        except OSError as exc:
            raise ShardError(f"cannot cache shard {url!r} in {path.parent}: {exc}") from exc
        self.evict(keep=path)
        return path

    def open(self, url: str) -> IO[bytes]:
        """The cached copy of ``url``, open for reading (downloaded again if it was evicted)."""
        for _ in range(3):
            path = self.ensure(url)
            try:
                return open(path, "rb")
            except FileNotFoundError:
                continue  # evicted between ensure() and open(): fetch it again
        raise ShardError(f"cached shard {url!r} keeps disappearing from {self.root}: is the cache limit too small?")

    def stream(self, url: str, consume: Callable[[IO[bytes]], T]) -> T:
        """Hand the cached copy of ``url`` (downloaded first if needed) to ``consume``."""
        with self.open(url) as f:
            return consume(f)

    def read_range(self, url: str, offset: int, size: int) -> bytes:
        """``size`` bytes of the cached copy of ``url`` at ``offset`` (downloaded first if needed; kept open)."""
        copy = self._descriptor(url)
        try:
            data = os.pread(copy.fd, size, offset)
        except OSError as exc:
            raise ShardError(f"cannot read the cached copy of shard {url!r}: {exc}") from exc
        if len(data) != size:
            raise ShardError(f"shard is truncated: {url!r} ends before byte {offset + size}")
        return data

    def _descriptor(self, url: str) -> "_Descriptor":
        """The kept descriptor of ``url``'s cached copy, opened (and stamped) on first use."""
        with self._lock:
            copy = self._open.get(url)
        if copy is not None:
            return copy
        with self.open(url) as f:
            copy = _Descriptor(os.dup(f.fileno()))
        with self._lock:
            copy = self._open.setdefault(url, copy)
            while len(self._open) > OPEN:
                del self._open[next(iter(self._open))]  # closed when no read holds it any more
        return copy

    def _download(self, url: str, path: Path) -> None:
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.part")

        def copy(stream: IO[bytes]) -> None:
            with open(tmp, "wb") as out:
                shutil.copyfileobj(stream, out, 1 << 20)

        try:
            transport_for(url, self.transfer).stream(url, copy)
            os.replace(tmp, path)
            path.with_suffix(".evicted").unlink(missing_ok=True)
        finally:
            if tmp.exists():
                tmp.unlink()

    def usage(self) -> int:
        """Bytes of shards in the cache."""
        return sum(s.st_size for _, s in _entries(Path(self.root)))

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Delete least recently used shards until at most ``limit`` bytes remain; return them."""
        if self.limit is None:
            return []
        entries = sorted(_entries(Path(self.root)), key=lambda e: e[1].st_atime_ns)
        total = sum(s.st_size for _, s in entries)
        removed = []
        for path, st in entries:
            if total <= self.limit:
                break
            if path == keep:
                continue
            path.with_suffix(".evicted").touch()  # what ensure() reads when it cannot be fetched again
            path.unlink(missing_ok=True)  # its index and lock file stay: small, and maybe in use
            total -= st.st_size
            removed.append(path)
        return removed


class _Descriptor:
    """An open file descriptor, closed when the last reference to it goes: a read that holds it is never cut."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        os.close(self.fd)


def _entries(root: Path) -> list[tuple[Path, os.stat_result]]:
    out = []
    for p in root.glob("*.tar"):
        try:
            out.append((p, p.stat()))
        except FileNotFoundError:
            continue  # evicted by another process while listing
    return out


def _touch(path: Path) -> bool:
    """Stamp ``path``'s access time (its modification time is kept: indexes check it); False if absent."""
    try:
        st = path.stat()
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
    except FileNotFoundError:
        return False
    return True
