"""s3:// and gs:// shards read from Python through fsspec (s3fs, gcsfs): metadata, streams, byte ranges.

Unshuffled, DALI's webdataset reader reads these shards itself (its own AWS and GCS
clients); feedfast reads their metadata here and, through :mod:`.transport`, the byte ranges
of a block-shuffled epoch and whole shards to cache under ``on_error: skip``: an s3 shard's
bytes over feedfast's http client on URLs botocore signs (:mod:`.s3http`), a gs shard's, and an
s3 shard's where signing there declines (:mod:`.s3sign`), here. fsspec and its backends are optional: without
them, reading fails with a ShardError saying what to install. Endpoints and credentials
are the clients' own settings (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).
"""

from __future__ import annotations

import http.client
import io
import time
from typing import IO, Any, Callable, TypeVar, cast

from feedfast.errors import ShardError
from feedfast.shards.transport.deadline import call_within
from feedfast.shards.transport.remote import DEFAULT_TRANSFER, RemoteError, Transfer

T = TypeVar("T")


def _not_found(url: str) -> ShardError:
    return RemoteError(f"shard not found: {url!r}", url=url, status=404)


def _fsspec(url: str) -> Any:
    try:
        import fsspec
    except ImportError as exc:
        raise ShardError(f"cannot read {url!r}: feedfast reads s3:// and gs:// shards and indexes through fsspec "
                         "(pip install s3fs, or gcsfs)") from exc
    return fsspec


def _filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the path within it."""
    try:
        return _fsspec(url).core.url_to_fs(url)  # type: ignore[no-any-return]
    except ImportError as exc:  # fsspec is there but not s3fs/gcsfs
        raise ShardError(f"cannot read {url!r}: {exc}") from exc


def read(url: str, consume: Callable[[IO[bytes]], T], transfer: Transfer = DEFAULT_TRANSFER) -> T:
    """Open ``url`` with fsspec and hand the stream to ``consume``; a stream that ends before the
    object's size is an IncompleteRead (retried by the caller), never a shorter shard.

    The open and every read run under http's deadline (``transfer.budget`` of the bytes so far,
    :func:`~feedfast.shards.transport.deadline.call_within`): past it a TimeoutError (retried), and the late
    call is abandoned to fsspec's own timeouts; the file it holds is closed when that call returns,
    never under it.
    """
    fs, path = _filesystem(url)
    started = time.monotonic()
    try:
        f = call_within(transfer.budget(0), f"open of {url}", lambda: fs.open(path, "rb"), late=_close)
    except FileNotFoundError as exc:
        raise _not_found(url) from exc
    stream = _Whole(f, getattr(f, "size", None), lambda got: started + transfer.budget(got) - time.monotonic(), url)
    try:
        return consume(cast(IO[bytes], stream))
    except FileNotFoundError as exc:
        raise _not_found(url) from exc
    finally:
        if not stream.abandoned:  # else the abandoned read closes it when it returns
            f.close()


def _close(f: Any) -> None:
    f.close()


class _Whole(io.RawIOBase):
    """A file that must give ``size`` bytes before its end (None: not known), each read within ``left(got)``
    seconds (the time left to the bytes so far)."""

    def __init__(self, f: Any, size: int | None, left: Callable[[int], float], url: str) -> None:
        super().__init__()
        self._f, self._size, self._got, self._left, self._url = f, size, 0, left, url
        self.abandoned = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.abandoned:  # a read of it is still out: never two at once
            raise TimeoutError(f"a read of {self._url} was abandoned at its deadline")
        f, wanted = self._f, len(buffer)
        try:
            data = call_within(self._left(self._got), f"read of {self._url} after byte {self._got}",
                               lambda: f.read(wanted), late=lambda _: f.close())
        except TimeoutError:
            self.abandoned = True
            raise
        n = len(data)
        buffer[:n] = data
        self._got += n
        if n == 0 and len(buffer) and self._size is not None and self._got < self._size:
            raise http.client.IncompleteRead(b"", self._size - self._got)
        return n


def read_range(url: str, offset: int, size: int, transfer: Transfer = DEFAULT_TRANSFER) -> bytes:
    """``size`` bytes of ``url`` at ``offset`` (one ranged GET), within ``transfer.budget(size)`` (as :func:`read`'s
    calls); a short answer is an IncompleteRead."""
    if size <= 0:
        return b""
    return call_within(transfer.budget(size), f"read of bytes {offset}-{offset + size - 1} of {url}",
                       lambda: _read_range(url, offset, size))


def _read_range(url: str, offset: int, size: int) -> bytes:
    fs, path = _filesystem(url)
    try:
        data = fs.cat_file(path, start=offset, end=offset + size)
    except FileNotFoundError as exc:
        raise _not_found(url) from exc
    if len(data) != size:
        raise http.client.IncompleteRead(data, size - len(data))
    return bytes(data)


def info(url: str, transfer: Transfer = DEFAULT_TRANSFER) -> dict[str, Any]:
    """fsspec's metadata of ``url`` (size, ETag, modification time), within ``transfer.budget(0)``."""
    return call_within(transfer.budget(0), f"metadata of {url}", lambda: _info(url))


def _info(url: str) -> dict[str, Any]:
    fs, path = _filesystem(url)
    try:
        return dict(fs.info(path))
    except FileNotFoundError as exc:
        raise _not_found(url) from exc
