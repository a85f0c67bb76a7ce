"""Remote shards: URL kinds, retries, and the http(s) and ``pipe:`` reads under :mod:`.transport`.

This module holds what the transports share (:class:`RemoteError`, :class:`Transfer`,
:func:`retrying`, :func:`url_kind`) and the http(s) and ``pipe:`` primitives; callers read
shards through :func:`feedfast.shards.transport.transport.transport_for`, which picks the scheme's reads:

- ``http`` (``https://host/a.tar``): ``GET``; ``GET`` with ``Range`` on kept-alive connections;
- ``pipe`` (``pipe:curl -s URL``): the command's stdout; no parts: cached whole first.

Connection errors, timeouts, truncated bodies and HTTP 5xx and 429 answers are retried
``Transfer.retries`` times, waiting ``backoff``, 2x, 4x ... seconds, while the fetch's deadline
(``Transfer.budget``, counted from its first try) leaves time; any other status, and
the last failure, raise :class:`RemoteError` (a ``ShardError``) naming the URL, the byte
range and the status. Redirects are followed to http(s) URLs only: one to another scheme
(``ftp://``, ``file://``) is a RemoteError naming it, never a request over that scheme. A ``pipe:`` command that exits non-zero is not retried: the error
names the command and the tail of its stderr; one that runs past http's deadline (of the
bytes it has written so far) is killed with its process group (:func:`open_pipe`). A server
that ignores ``Range`` (answers 200) is read through up to the wanted bytes: correct, but slow
for large shards.

What a server cannot do to a read:

- hold it: every fetch (connection, headers, body, and its retries) ends within
  ``Transfer.budget`` of its bytes (``deadline`` plus the bytes at ``min_rate``) from its first
  try, enforced by cutting the socket (:mod:`.deadline`), not only per socket read: a server
  trickling 4 bytes a second fails the fetch at its deadline, and a server that answers each
  try after the socket timeout is given up there, not after every try's timeout;
- flood it: a ranged read takes at most the bytes it asked for, whatever the answer's size
  (a 206 of 300 MB for a 16-byte range is read for 16 bytes, after its ``Content-Range`` is
  checked to start at the offset asked, and its connection dropped);
- shorten it: a body shorter than asked (a range) or than its ``Content-Length`` (a whole
  shard, :class:`Body`) is an ``IncompleteRead``, retried; Python's ``read(n)`` alone returns
  such a body short without an error.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import io
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message
from functools import partial
from typing import IO, Any, Callable, Iterator, TypeVar, cast

from feedfast.errors import ShardError
from feedfast.shards.transport import httpconn, schemes
from feedfast.shards.transport.deadline import Deadline

T = TypeVar("T")
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
NOT_THERE = frozenset({403, 404, 410})  # statuses that say the URL names nothing to read (a 403: a private object)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 1 << 20


class RemoteError(ShardError):
    """A remote shard could not be read; names the URL, and the HTTP status when there was one."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        self.url, self.status = url, status
        super().__init__(message)


@dataclass(frozen=True)
class Transfer:
    """How remote reads behave (seconds, bytes per second).

    Attributes:
        timeout: the longest wait for one socket read (and for a connection).
        retries, backoff: retries of a failed read, the first wait between them (doubling).
        deadline, min_rate: every fetch, its retries included, ends within ``deadline`` plus its
            bytes at ``min_rate`` (:meth:`budget`) of its first try, whatever the server does: a
            server that trickles bytes answers every read in time but not the fetch.
    """

    timeout: float = 30.0
    retries: int = 3
    backoff: float = 0.5
    deadline: float = 60.0
    min_rate: float = 256 * 1024

    def budget(self, nbytes: int) -> float:
        """Seconds a request for ``nbytes`` bytes may take, all of it (connection, headers, body)."""
        return self.deadline + max(0, nbytes) / self.min_rate


DEFAULT_TRANSFER = Transfer()


def url_kind(url: str) -> str:
    """``file``, ``http``, ``pipe``, ``s3`` or ``gs``: how a shard name is read (:func:`.schemes.url_kind`).

    Raises:
        ShardError: a scheme no transport reads; names it and the supported ones.
    """
    return schemes.url_kind(url)


def retrying(url: str, transfer: Transfer, action: Callable[[], T], where: str = "", *,
             began: float | None = None, moved: Callable[[], int] = lambda: 0) -> T:
    """Run ``action``, retrying transient network failures; translate them into RemoteError.

    ``where`` follows the URL in messages (`` at bytes 0-511``). With ``began`` (the
    :func:`time.monotonic` reading the fetch started at, which its tries' deadlines count from too) the
    whole fetch, retries included, is held to ``transfer.budget(moved())`` (``moved``: the bytes its
    tries asked for or moved): a retry whose wait would end past it is not made.
    """
    def out_of_time(wait: float) -> str:
        """'' while a retry after ``wait`` seconds ends within the fetch's deadline, else why it is not made."""
        if began is None or time.monotonic() + wait < began + transfer.budget(moved()):
            return ""
        return (f" (no time left to retry within the fetch's deadline, retries included: {transfer.deadline:g} s "
                f"plus its bytes at {transfer.min_rate:g} B/s)")

    for attempt in range(transfer.retries + 1):
        wait = transfer.backoff * 2**attempt
        try:
            return action()
        except urllib.error.HTTPError as exc:
            stopped = out_of_time(wait) if exc.code in RETRY_STATUS and attempt < transfer.retries else ""
            if exc.code not in RETRY_STATUS or attempt == transfer.retries or stopped:
                tries = f" after {attempt + 1} tries" if attempt else ""
                raise RemoteError(f"cannot read shard {url!r}{where}: HTTP {exc.code} {exc.reason}{tries}{stopped}",
                                  url=url, status=exc.code) from exc
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            stopped = out_of_time(wait) if attempt < transfer.retries else ""
            if attempt == transfer.retries or stopped:
                reason = getattr(exc, "reason", None) or exc
                raise RemoteError(f"cannot read shard {url!r}{where} after {attempt + 1} tries: "
                                  f"{type(exc).__name__}: {reason}{stopped}", url=url) from exc
        time.sleep(wait)
    raise AssertionError("unreachable")


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, to http(s) only: a server never chooses the transport (urllib's own follows ``ftp://``)."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: http.client.HTTPMessage, newurl: str) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise urllib.error.HTTPError(req.full_url, code, f"{msg}: redirect to {newurl} refused: feedfast "
                                         "follows redirects to http(s) only", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    """urllib's opener with :class:`_HttpRedirects`; built at first use, as ``urlopen``'s is (proxies read then)."""
    return urllib.request.build_opener(_HttpRedirects)


def _http(url: str, transfer: Transfer, headers: dict[str, str] | None = None, method: str = "GET") -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": "feedfast", **(headers or {})}, method=method)
    return _opener().open(req, timeout=transfer.timeout)


def _socket_of(resp: Any) -> Any:
    """The socket under a urllib response (None if it cannot be found): what a deadline cuts."""
    return getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)


def fetch_range(url: str, offset: int, size: int, transfer: Transfer = DEFAULT_TRANSFER, *,
                name: str | None = None) -> bytes:
    """``size`` bytes of an http(s) shard at ``offset``, by a ``Range`` request (retried).

    Requests go over this thread's kept-alive connection (:mod:`.httpconn`), or through
    urllib when a proxy is configured or the server redirects. Each one ends within
    ``transfer.budget(size)`` seconds, and reads at most ``size`` bytes of the answer (of a
    200 answer, which ignored ``Range``, the bytes up to the range's end). ``name`` is the
    shard's name in messages when it is not ``url`` (an ``s3://`` URL read through a signed one,
    which must not be logged).

    Raises:
        RemoteError: the bytes cannot be read (after the retries), the server answered
            another range, or the shard ends before them; names the URL and the byte range.
    """
    if size <= 0:
        return b""
    end = offset + size - 1
    headers = {"User-Agent": "feedfast", "Range": f"bytes={offset}-{end}"}
    name = name or url

    began = time.monotonic()

    def once() -> bytes:
        with Deadline(transfer.budget(size), f"GET of bytes {offset}-{end} of {name}", began=began) as deadline:
            if httpconn.usable(url):
                try:
                    status, got, body = httpconn.get(url, headers, transfer.timeout, deadline, limit=size,
                                                     full_limit=offset + size,
                                                     full_seconds=transfer.budget(offset + size))
                    return _cut(name, status, got.get("Content-Range", ""), body, offset, size)
                except urllib.error.HTTPError as exc:
                    if exc.code not in _REDIRECTS:
                        raise
            with _http(url, transfer, headers) as resp:
                deadline.bind(_socket_of(resp))
                if resp.status == 206:
                    body = resp.read(size)
                    deadline.check()
                    return _cut(name, 206, resp.headers.get("Content-Range", ""), body, offset, size)
                deadline.extend(transfer.budget(offset + size))
                _skip(resp, offset)  # the server ignored Range: read through to the wanted bytes
                body = resp.read(size)
                deadline.check()
                return _cut(name, resp.status, "", body, 0, size)

    return retrying(name, transfer, once, where=f" at bytes {offset}-{end}", began=began, moved=lambda: size)


def _cut(url: str, status: int, content_range: str, body: bytes, offset: int, size: int) -> bytes:
    """The wanted bytes of a 206 (starting at ``offset``) or of a whole body (``body[offset:]``).

    A 206 must start at ``offset`` (its ``Content-Range``); a longer one was read only up to
    ``size`` bytes. A body shorter than asked is an IncompleteRead (retried), unless the
    ``Content-Range`` says the shard itself ends first (a RemoteError, not retried).
    """
    if status == 206:
        _check_content_range(url, content_range, offset, size)
        data = body[:size]
    else:
        data = body[offset:offset + size]
    if len(data) != size:
        raise ShortBody(len(data), size, "answer to the range asked")
    return bytes(data)


def _check_content_range(url: str, header: str, offset: int, size: int) -> None:
    """A 206's ``Content-Range`` (``bytes a-b/total``) must start at ``offset``, and the shard reach ``offset + size``."""
    span, _, total = header.removeprefix("bytes ").partition("/")
    start = span.split("-", 1)[0].strip()
    if start.isdigit() and int(start) != offset:
        raise RemoteError(f"server answered range {header!r} of {url!r}, not offset {offset}", url=url, status=206)
    if total.strip().isdigit() and int(total) < offset + size:
        raise RemoteError(f"shard is truncated: {url!r} has {int(total)} bytes, it ends before byte {offset + size} "
                          f"(bytes {offset}-{offset + size - 1} asked)", url=url, status=206)


def _skip(stream: IO[bytes], count: int) -> None:
    while count > 0:
        got = len(stream.read(min(count, _CHUNK)))
        if not got:
            raise http.client.IncompleteRead(b"", count)
        count -= got


class ShortBody(http.client.IncompleteRead):
    """An answer that ended before the bytes it promised or was asked for (the server dropped the connection)."""

    def __init__(self, got: int, expected: int, what: str = "body") -> None:
        super().__init__(b"", expected - got)
        self.got, self.expected, self.what = got, expected, what

    def __str__(self) -> str:
        return f"the {self.what} ended after {self.got} of its {self.expected} bytes (the connection was dropped)"

    __repr__ = __str__


class Body(io.RawIOBase):
    """An http body as a forward stream that ends only where its ``Content-Length`` says.

    Python's ``read(n)`` returns short, without an error, when the server drops the
    connection; here a body that ends early is an ``IncompleteRead`` (retried by the
    caller), never a shorter shard. Each read pushes the request's deadline to the bytes so
    far at ``transfer.min_rate`` (with ``before``, the bytes of the fetch's earlier tries, whose
    deadline it shares), so a long download is bounded and a trickle is stopped.
    """

    def __init__(self, resp: Any, transfer: Transfer, deadline: Deadline, *, before: int = 0) -> None:
        super().__init__()
        self._resp, self._transfer, self._deadline = resp, transfer, deadline
        self.expected: int | None = resp.length  # None when chunked or closed-delimited
        self.got = 0
        self._before = before  # bytes of the fetch's earlier tries: the deadline counts from its first

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wanted = len(buffer) if self.expected is None else min(len(buffer), self.expected - self.got)
        self._deadline.extend(self._transfer.budget(self._before + self.got + wanted))
        try:
            n = self._resp.readinto(buffer)
        except (http.client.HTTPException, OSError):
            self._deadline.check()
            raise
        self._deadline.check()
        self.got += n
        if n == 0 and len(buffer) and self.expected is not None and self.got < self.expected:
            raise ShortBody(self.got, self.expected, "body (its Content-Length)")
        return n


def http_stream(url: str, consume: Callable[[IO[bytes]], T], transfer: Transfer = DEFAULT_TRANSFER, *,
                name: str | None = None) -> T:
    """GET an http(s) shard and hand the body (a :class:`Body`) to ``consume``; the whole read is retried.

    A failure mid-stream (a dropped connection, a body shorter than its ``Content-Length``,
    the deadline) retries from the start, so ``consume`` must not keep state between calls.
    ``name``: the shard's name in messages, as for :func:`fetch_range`.

    Raises:
        RemoteError: the shard cannot be read; names the URL and the HTTP status.
    """
    headers = {"User-Agent": "feedfast"}
    name = name or url
    began, moved = time.monotonic(), [0]  # the bytes of the tries before: their time is the fetch's too

    def once() -> T:
        with Deadline(transfer.budget(moved[0]), f"GET of {name}", began=began) as deadline:
            body: Body | None = None
            try:
                if httpconn.usable(url):
                    try:
                        conn, resp = httpconn.open_stream(url, headers, transfer.timeout, deadline)
                    except urllib.error.HTTPError as exc:
                        if exc.code not in _REDIRECTS:
                            raise
                    else:
                        with contextlib.closing(conn):
                            body = Body(resp, transfer, deadline, before=moved[0])
                            return consume(cast(IO[bytes], body))
                with _http(url, transfer, headers) as resp:
                    deadline.bind(_socket_of(resp))
                    body = Body(resp, transfer, deadline, before=moved[0])
                    return consume(cast(IO[bytes], body))
            finally:
                moved[0] += body.got if body is not None else 0

    return retrying(name, transfer, once, began=began, moved=lambda: moved[0])


@contextlib.contextmanager
def open_pipe(url: str, transfer: Transfer = DEFAULT_TRANSFER) -> Iterator[IO[bytes]]:
    """The stdout of a ``pipe:CMD`` shard, under http's deadline; a non-zero exit is a RemoteError with stderr's tail.

    The command runs in a process group of its own, and the whole run (until it exits) must
    end within ``transfer.budget`` of the bytes it has written so far (``deadline`` plus those
    bytes at ``min_rate``), as an http download must: past it the group is killed (its
    children too: ``sleep 1000 | cat``, and those that left it with ``setsid``), the blocked
    read returns, and the run is a RemoteError naming the shard and the deadline (not retried:
    a command may not be repeatable). Leaving early (an error in ``consume``) kills the group as well.
    """
    cmd = url[len(schemes.PIPE.prefixes[0]):]
    with tempfile.TemporaryFile() as err, Deadline(transfer.budget(0), f"shard command {cmd!r}") as deadline:
        proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=err,  # noqa: S602 - the user's command
                                start_new_session=True)  # its own process group: killed whole
        assert proc.stdout is not None
        deadline.bind_stop(partial(_kill_group, proc))
        out = PipeOut(proc.stdout, transfer, deadline)
        try:
            try:
                yield cast(IO[bytes], io.BufferedReader(out, _CHUNK))
                out.drain()  # let the command finish writing
            finally:
                proc.stdout.close()
            code = proc.wait()  # past the deadline the watchdog kills the group, so this returns
            deadline.bind_stop(None)  # reaped: its number may be another's soon
            deadline.check()
        except BaseException as exc:
            _kill_group(proc)
            proc.wait()
            deadline.bind_stop(None)
            if deadline.expired:
                raise RemoteError(f"cannot read shard {url!r}: the command did not finish within its deadline of "
                                  f"{deadline.seconds:.3g} s (Transfer.deadline {transfer.deadline:g} s plus "
                                  f"{out.got} bytes written at min_rate {transfer.min_rate:g} B/s); its process "
                                  "group was killed", url=url) from exc
            raise
        if code != 0:
            err.seek(0)
            tail = err.read()[-2000:].decode("utf-8", "replace").strip()
            raise RemoteError(f"shard command failed (exit {code}): {cmd!r}: {tail or 'no stderr output'}", url=url)


class PipeOut(io.RawIOBase):
    """A ``pipe:`` command's stdout whose deadline moves with its bytes (as :class:`Body`'s): each read first
    pushes it to ``transfer.budget`` of the bytes so far, and a read that returns past it raises TimeoutError."""

    def __init__(self, stdout: IO[bytes], transfer: Transfer, deadline: Deadline) -> None:
        super().__init__()
        self._stdout, self._transfer, self._deadline = stdout, transfer, deadline
        self.got = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._deadline.extend(self._transfer.budget(self.got))
        n = self._stdout.readinto1(buffer)  # type: ignore[attr-defined]  # what is there: the deadline moves on
        self._deadline.check()
        self.got += n
        return n

    def drain(self) -> None:
        """Read to the end, under the deadline, dropping the bytes (also after a reader closed its wrapper)."""
        buffer = bytearray(_CHUNK)
        while self.readinto(buffer):
            pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a command started in its own session: its process group, and its descendants that left the group
    (``setsid``, a daemonizing child) while their parents live. A descendant whose parent has exited is init's,
    not the command's, and is not found (quick: the watchdog calls it)."""
    if proc.returncode is not None:
        return  # reaped: the number is no longer its
    import psutil

    try:
        strays = [p for p in psutil.Process(proc.pid).children(recursive=True) if _group_of(p.pid) != proc.pid]
    except psutil.Error:
        strays = []  # the command is gone: its group's members, if any, are killed below
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already
    for stray in strays:
        try:
            stray.kill()  # psutil checks it is still the process found above, not a reused number
        except psutil.Error:
            pass


def _group_of(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def http_validators(url: str, transfer: Transfer = DEFAULT_TRANSFER) -> dict[str, str]:
    """What identifies this version of an http(s) shard: ETag, Last-Modified, Content-Length.

    Empty when ``HEAD`` is refused (403, 405, 501).
    """
    began = time.monotonic()

    def once() -> Message:
        with Deadline(transfer.budget(0), f"HEAD of {url}", began=began) as deadline:
            if httpconn.usable(url):
                try:
                    return httpconn.get(url, {"User-Agent": "feedfast"}, transfer.timeout, deadline, limit=0,
                                        method="HEAD")[1]
                except urllib.error.HTTPError as exc:
                    if exc.code not in _REDIRECTS:
                        raise
            with _http(url, transfer, method="HEAD") as resp:
                return resp.headers  # type: ignore[no-any-return]

    try:
        headers = retrying(url, transfer, once, began=began)
    except RemoteError as exc:
        if exc.status in (403, 405, 501):  # HEAD refused (a URL signed for GET gives 403): GET will tell
            return {}
        raise
    return {k.lower(): headers[k] for k in ("ETag", "Last-Modified", "Content-Length") if headers.get(k)}
