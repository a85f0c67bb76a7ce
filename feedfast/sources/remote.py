"""Remote shards: URL kinds, retries, and the http(s) and ``pipe:`` reads under :mod:`.transport`.

This module holds what the transports share (:class:`RemoteError`, :class:`Transfer`,
:func:`retrying`, :func:`url_kind`) and the http(s) and ``pipe:`` primitives; callers read
shards through :func:`feedfast.sources.transport.transport_for`, which picks the scheme's reads:

- ``http`` (``https://host/a.tar``): ``GET``; ``GET`` with ``Range`` on kept-alive connections;
- ``pipe`` (``pipe:curl -s URL``): the command's stdout; no parts: cached whole first.

Connection errors, timeouts, truncated bodies and HTTP 5xx and 429 answers are retried
``Transfer.retries`` times, waiting ``backoff``, 2x, 4x ... seconds; any other status, and
the last failure, raise :class:`RemoteError` (a ``ShardError``) naming the URL and the
status. A ``pipe:`` command that exits non-zero is not retried: the error names the command
and the tail of its stderr. A server that ignores ``Range`` (answers 200) is read through
up to the wanted bytes: correct, but slow for large shards.
"""

from __future__ import annotations

import contextlib
import http.client
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator, TypeVar

from feedfast.errors import ShardError
from feedfast.sources import httpconn

T = TypeVar("T")
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_SCHEMES = {"http://": "http", "https://": "http", "pipe:": "pipe", "s3://": "s3", "gs://": "gs"}
_CHUNK = 1 << 20


class RemoteError(ShardError):
    """A remote shard could not be read; names the URL, and the HTTP status when there was one."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        self.url, self.status = url, status
        super().__init__(message)


@dataclass(frozen=True)
class Transfer:
    """How remote reads behave: a timeout per request, retries and their first backoff (seconds)."""

    timeout: float = 30.0
    retries: int = 3
    backoff: float = 0.5


DEFAULT_TRANSFER = Transfer()


def url_kind(url: str) -> str:
    """``file``, ``http``, ``pipe``, ``s3`` or ``gs``: how a shard name is read."""
    return next((kind for prefix, kind in _SCHEMES.items() if url.startswith(prefix)), "file")


def retrying(url: str, transfer: Transfer, action: Callable[[], T]) -> T:
    """Run ``action``, retrying transient network failures; translate them into RemoteError."""
    for attempt in range(transfer.retries + 1):
        last = attempt == transfer.retries
        try:
            return action()
        except urllib.error.HTTPError as exc:
            if exc.code not in RETRY_STATUS or last:
                tries = f" after {attempt + 1} tries" if attempt else ""
                raise RemoteError(f"cannot read shard {url!r}: HTTP {exc.code} {exc.reason}{tries}",
                                  url=url, status=exc.code) from exc
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            if last:
                reason = getattr(exc, "reason", None) or exc
                raise RemoteError(f"cannot read shard {url!r} after {attempt + 1} tries: "
                                  f"{type(exc).__name__}: {reason}", url=url) from exc
        time.sleep(transfer.backoff * 2**attempt)
    raise AssertionError("unreachable")


def _http(url: str, transfer: Transfer, headers: dict[str, str] | None = None, method: str = "GET") -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": "feedfast", **(headers or {})}, method=method)
    return urllib.request.urlopen(req, timeout=transfer.timeout)  # noqa: S310 - http(s) only, checked by kind


def fetch_range(url: str, offset: int, size: int, transfer: Transfer = DEFAULT_TRANSFER) -> bytes:
    """``size`` bytes of an http(s) shard at ``offset``, by a ``Range`` request (retried).

    Requests go over this thread's kept-alive connection (:mod:`.httpconn`), or through
    urllib when a proxy is configured or the server redirects.
    """
    if size <= 0:
        return b""
    headers = {"User-Agent": "feedfast", "Range": f"bytes={offset}-{offset + size - 1}"}

    def once() -> bytes:
        if httpconn.usable(url):
            try:
                status, got, body = httpconn.get(url, headers, transfer.timeout, full_limit=offset + size)
                return _cut(url, status, got.get("Content-Range", ""), body, offset, size)
            except urllib.error.HTTPError as exc:
                if exc.code not in _REDIRECTS:
                    raise
        with _http(url, transfer, headers) as resp:
            if resp.status == 206:
                return _cut(url, 206, resp.headers.get("Content-Range", ""), resp.read(size), offset, size)
            _skip(resp, offset)  # the server ignored Range: read through to the wanted bytes
            return _cut(url, resp.status, "", resp.read(size), 0, size)

    return retrying(url, transfer, once)


def _cut(url: str, status: int, content_range: str, body: bytes, offset: int, size: int) -> bytes:
    """The wanted bytes of a 206 (starting at ``offset``) or of a whole body (``body[offset:]``)."""
    if status == 206:
        _check_content_range(url, content_range, offset)
        data = body[:size]
    else:
        data = body[offset:offset + size]
    if len(data) != size:
        raise http.client.IncompleteRead(data, size - len(data))
    return bytes(data)


def _check_content_range(url: str, header: str, offset: int) -> None:
    start = header.removeprefix("bytes ").split("-", 1)[0]
    if start.strip().isdigit() and int(start) != offset:
        raise RemoteError(f"server answered range {header!r} of {url!r}, not offset {offset}", url=url, status=206)


def _skip(stream: IO[bytes], count: int) -> None:
    while count > 0:
        got = len(stream.read(min(count, _CHUNK)))
        if not got:
            raise http.client.IncompleteRead(b"", count)
        count -= got


def http_stream(url: str, consume: Callable[[IO[bytes]], T], transfer: Transfer = DEFAULT_TRANSFER) -> T:
    """GET an http(s) shard and hand the body to ``consume``; the whole read is retried.

    A failure mid-stream (a dropped connection, a truncated body) retries from the start,
    so ``consume`` must not keep state between calls.

    Raises:
        RemoteError: the shard cannot be read; names the URL and the HTTP status.
    """

    def once() -> T:
        with _http(url, transfer) as resp:
            return consume(resp)

    return retrying(url, transfer, once)


@contextlib.contextmanager
def open_pipe(url: str) -> Iterator[IO[bytes]]:
    """The stdout of a ``pipe:CMD`` shard; a non-zero exit is a ShardError with stderr's tail."""
    cmd = url.removeprefix("pipe:")
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=err)  # noqa: S602 - the user's command
        assert proc.stdout is not None
        try:
            yield proc.stdout
            shutil.copyfileobj(proc.stdout, _Discard())  # let the command finish writing
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            proc.stdout.close()
        code = proc.wait()
        if code != 0:
            err.seek(0)
            tail = err.read()[-2000:].decode("utf-8", "replace").strip()
            raise RemoteError(f"shard command failed (exit {code}): {cmd!r}: {tail or 'no stderr output'}", url=url)


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def http_validators(url: str, transfer: Transfer = DEFAULT_TRANSFER) -> dict[str, str]:
    """What identifies this version of an http(s) shard: ETag, Last-Modified, Content-Length.

    Empty when ``HEAD`` is refused (403, 405, 501).
    """
    try:
        with retrying(url, transfer, lambda: _http(url, transfer, method="HEAD")) as resp:
            headers = resp.headers
    except RemoteError as exc:
        if exc.status in (403, 405, 501):  # HEAD refused (a URL signed for GET gives 403): GET will tell
            return {}
        raise
    return {k.lower(): headers[k] for k in ("ETag", "Last-Modified", "Content-Length") if headers.get(k)}
