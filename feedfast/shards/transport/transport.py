"""One way to read a shard's bytes, whatever its scheme: whole, by byte range, and its version.

Every scheme is one :class:`Transport`, picked by :func:`transport_for`; callers (the
remote index, the shard cache) hold a transport and never ask which scheme they read, as
fsspec's ``AbstractFileSystem`` does. Caching is one more layer that wraps any of them
(:class:`feedfast.shards.transport.cache.ShardCache`). Nothing here calls back up. Each transport
names its declaration in the one registry of kinds (:mod:`.schemes`: its URL schemes, and
whether it reads ranges, is read by DALI natively, can be rescued, is cached), and
:func:`transport_for` picks by that registry: a scheme no transport declares is an error.
Every stream ends only at the shard's end (a short body is an error, retried), and every
http request (s3's too) has an overall deadline and reads at most the bytes asked for
(:mod:`.remote`), and so does every ``pipe:`` command (killed with its process group past it).
gs, and s3 where it is read through fsspec, have the same deadline on each call into fsspec
(open, each read, ``cat_file``, ``info``: :func:`~feedfast.shards.transport.deadline.call_within`), but a
late call cannot be stopped, only abandoned: its thread runs on until fsspec's own timeouts
(aiohttp's, botocore's) end it, its answer dropped; a read of at most ``size`` bytes is fsspec's.

==========  ===========================  ============================  ==========================
scheme      ``stream`` (whole, retried)  ``read_range``                ``validators``
==========  ===========================  ============================  ==========================
``file``    ``open``                     ``pread``                     size, mtime
``http``    ``GET``                      ``GET`` + ``Range``,          ETag, Last-Modified,
                                         kept-alive (:mod:`.httpconn`) Content-Length (``HEAD``)
``s3``      ``GET`` of a URL signed      ``GET`` + ``Range`` of it,    ETag, mtime, size (fsspec)
            here (:mod:`.s3sign`)        as http's (:mod:`.s3http`)
``gs``      fsspec (gcsfs)               fsspec ``cat_file``           ETag, mtime, size
``pipe``    the command's stdout         none: read it through the     none
                                         shard cache
==========  ===========================  ============================  ==========================

Why http is not fsspec's ``HTTPFileSystem`` (fsspec 2026.9, aiohttp 3.14): on 127.0.0.1 (2
cores) its ``cat_file`` served 1.2 to 1.6 times fewer ranged requests per second than
:func:`~feedfast.shards.transport.remote.fetch_range` for 4 KB and 56 KB ranges (a sample; 1 and 4
threads) and about as many for 256 KB ones (a coalesced batch); its batched ``cat_ranges``
managed under 30 requests per second; it returns a whole 200 body as if it were the range
when a server ignores ``Range``; and it does not retry a 503. For the same reasons s3's bytes
come through that client too, on URLs that botocore signs here (fsspec's s3fs cost 3.8 ms of
CPU a 1.4 MB range on 127.0.0.1, the signed GET 1.0 ms: :mod:`.s3sign`); s3fs stays for
metadata, and for everything where signing here declines. gs has no in-house client: gcsfs.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import IO, Callable, TypeVar

from feedfast.errors import ShardError
from feedfast.shards.transport import objectstore, s3http, s3sign, schemes
from feedfast.shards.transport.remote import (
    DEFAULT_TRANSFER,
    Transfer,
    fetch_range,
    http_stream,
    http_validators,
    open_pipe,
    retrying,
)

T = TypeVar("T")


class Transport(ABC):
    """How the shards of one URL scheme are read; ``kind`` is its declaration in :mod:`.schemes`."""

    kind: schemes.Kind  # a class attribute, or a dataclass field where one class serves two kinds

    @property
    def ranged(self) -> bool:
        """Whether :meth:`read_range` is supported (a pipe's bytes come only in order)."""
        return self.kind.ranged

    @abstractmethod
    def stream(self, url: str, consume: Callable[[IO[bytes]], T]) -> T:
        """Hand the whole shard, as a forward stream, to ``consume``; a failed read restarts it.

        The stream ends only at the shard's end: a body that ends early (a dropped
        connection) is an error, retried, never a shorter shard.

        Raises:
            ShardError: the shard cannot be read; names it (a RemoteError with the HTTP status).
        """

    @abstractmethod
    def read_range(self, url: str, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes of the shard at ``offset``.

        Raises:
            ShardError: the shard cannot be read, ends early, or has no ranged reads; names it.
        """

    def validators(self, url: str) -> dict[str, str]:
        """What identifies this version of the shard (empty when nothing does)."""
        return {}


class FileTransport(Transport):
    """Local paths and ``file://`` URLs."""

    kind = schemes.FILE

    def stream(self, url: str, consume: Callable[[IO[bytes]], T]) -> T:
        try:
            with open(_path(url), "rb") as f:
                return consume(f)
        except OSError as exc:
            raise ShardError(f"cannot read shard {url!r}: {exc.strerror or exc}") from exc

    def read_range(self, url: str, offset: int, size: int) -> bytes:
        try:
            fd = os.open(_path(url), os.O_RDONLY)
            try:
                data = os.pread(fd, size, offset)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ShardError(f"cannot read shard {url!r}: {exc.strerror or exc}") from exc
        if len(data) != size:
            raise ShardError(f"shard is truncated: {url!r} ends before byte {offset + size}")
        return data

    def validators(self, url: str) -> dict[str, str]:
        try:
            st = os.stat(_path(url))
        except OSError as exc:
            raise ShardError(f"cannot read shard {url!r}: {exc.strerror or exc}") from exc
        return {"size": str(st.st_size), "mtime": str(st.st_mtime_ns)}


@dataclass(frozen=True)
class HttpTransport(Transport):
    """http(s) URLs: ``GET``, ``Range`` requests on kept-alive connections, ``HEAD`` (see :mod:`.remote`)."""

    transfer: Transfer = DEFAULT_TRANSFER
    kind: schemes.Kind = field(default=schemes.HTTP, init=False, repr=False)

    def stream(self, url: str, consume: Callable[[IO[bytes]], T]) -> T:
        return http_stream(url, consume, self.transfer)

    def read_range(self, url: str, offset: int, size: int) -> bytes:
        return fetch_range(url, offset, size, self.transfer)

    def validators(self, url: str) -> dict[str, str]:
        return http_validators(url, self.transfer)


@dataclass(frozen=True)
class ObjectStoreTransport(Transport):
    """s3:// and gs:// URLs through fsspec (see :mod:`.objectstore`), retried as http is."""

    transfer: Transfer = DEFAULT_TRANSFER
    kind: schemes.Kind = schemes.S3  # or schemes.GS

    def stream(self, url: str, consume: Callable[[IO[bytes]], T]) -> T:
        return retrying(url, self.transfer, lambda: objectstore.read(url, consume, self.transfer))

    def read_range(self, url: str, offset: int, size: int) -> bytes:
        return retrying(url, self.transfer, lambda: objectstore.read_range(url, offset, size, self.transfer))

    def validators(self, url: str) -> dict[str, str]:
        found = retrying(url, self.transfer, lambda: objectstore.info(url, self.transfer))
        return {k: str(found[k]) for k in ("ETag", "etag", "LastModified", "mtime", "size") if found.get(k)}


@dataclass(frozen=True)
class S3Transport(ObjectStoreTransport):
    """s3:// URLs: bytes over feedfast's http client on URLs botocore signs here (:mod:`.s3http`), metadata through
    fsspec; everything through fsspec where signing here declines (s3fs configured in fsspec's config, no
    credentials: :func:`.s3sign.signer`)."""

    kind: schemes.Kind = field(default=schemes.S3, init=False, repr=False)

    def stream(self, url: str, consume: Callable[[IO[bytes]], T]) -> T:
        signer = s3sign.signer()
        if signer is None:
            return super().stream(url, consume)
        return s3http.stream(signer, url, consume, self.transfer)

    def read_range(self, url: str, offset: int, size: int) -> bytes:
        signer = s3sign.signer()
        if signer is None:
            return super().read_range(url, offset, size)
        return s3http.read_range(signer, url, offset, size, self.transfer)


@dataclass(frozen=True)
class PipeTransport(Transport):
    """``pipe:CMD`` shards: the command's stdout, once, in order, under http's deadline (killed past it: see
    :func:`~feedfast.shards.transport.remote.open_pipe`); not retried (a command may not be repeatable)."""

    transfer: Transfer = DEFAULT_TRANSFER
    kind: schemes.Kind = field(default=schemes.PIPE, init=False, repr=False)

    def stream(self, url: str, consume: Callable[[IO[bytes]], T]) -> T:
        with open_pipe(url, self.transfer) as out:
            return consume(out)

    def read_range(self, url: str, offset: int, size: int) -> bytes:
        raise ShardError(f"a pipe: shard has no byte ranges: {url!r}; read it through the shard cache")


_BY_KIND: dict[str, Callable[[Transfer], Transport]] = {
    schemes.FILE.name: lambda transfer: FileTransport(),
    schemes.HTTP.name: HttpTransport,
    schemes.S3.name: S3Transport,
    schemes.GS.name: lambda transfer: ObjectStoreTransport(transfer, schemes.GS),
    schemes.PIPE.name: PipeTransport,
}


def transport_for(url: str, transfer: Transfer = DEFAULT_TRANSFER) -> Transport:
    """The transport that reads ``url``: by its scheme in :mod:`.schemes` (local paths are ``file``).

    Raises:
        ShardError: no transport reads the URL's scheme; names it and the supported ones.
    """
    return _BY_KIND[schemes.url_kind(url)](transfer)


def _path(url: str) -> str:
    return url[len(schemes.FILE.prefixes[0]):] if url.startswith(schemes.FILE.prefixes) else url
