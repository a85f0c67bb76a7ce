"""Kept-alive HTTP connections, one set per thread, for the many small Range requests of a stream.

urllib opens a new connection per request; a shuffled epoch asks for one range per
sample, so a TCP (and TLS) handshake per sample would cost more than the bytes. Each
reader thread keeps one connection per host. A request that fails on a reused connection
(the server closed it while idle) is sent once more on a fresh one at once; other
failures are left to the caller's retries. Responses that are not 200 or 206 raise
``urllib.error.HTTPError``, as urllib would, with the start of their body (an S3 error's XML
says why). Redirects and proxies (``HTTP(S)_PROXY``)
are left to urllib: :func:`usable` says when this path applies.

Every request runs under a :class:`~feedfast.shards.transport.deadline.Deadline` (its socket is cut
when the time is up: a trickling server cannot hold it), and a body is read only up to the
bytes asked for: the rest of a larger answer is never read, and its connection is dropped
instead of kept.
"""

from __future__ import annotations

import http.client
import io
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message

from feedfast.shards.transport.deadline import Deadline

_local = threading.local()
_ERROR_BODY = 4096  # bytes of an error answer read for its message (an S3 error's XML is a few hundred)
_USABLE: dict[tuple[str, str], bool] = {}
"""Per (scheme, host), whether no proxy applies: the proxy settings are read once per host and process.

``urllib.request.getproxies`` walks the whole environment each call (0.35 ms a request here, half
a sample-sized request's CPU on 127.0.0.1); the environment is the process's configuration, read once.
"""


_TRUSTED: dict[str, ssl.SSLContext] = {}
"""Per host (``netloc``), the TLS context of a CA bundle its client was told to trust (:func:`trust`)."""


def trust(netloc: str, cafile: str) -> None:
    """Verify https connections to ``netloc`` against ``cafile`` (a client's own CA bundle: ``AWS_CA_BUNDLE``)."""
    if netloc not in _TRUSTED:
        _TRUSTED[netloc] = ssl.create_default_context(cafile=cafile)


def usable(url: str) -> bool:
    """Whether ``url`` can go over a kept-alive connection (http(s), no proxy configured for it)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return False
    key = (parts.scheme, parts.hostname or "")
    found = _USABLE.get(key)
    if found is None:
        proxies = urllib.request.getproxies()
        found = _USABLE[key] = parts.scheme not in proxies or bool(urllib.request.proxy_bypass(key[1]))
    return found


def get(url: str, headers: dict[str, str], timeout: float, deadline: Deadline, *, limit: int,
        full_limit: int | None = None, full_seconds: float | None = None,
        method: str = "GET") -> tuple[int, Message, bytes]:
    """GET (or HEAD) ``url`` on this thread's connection to its host: (status, headers, body).

    At most ``limit`` bytes of a 206 body are read, and ``full_limit`` (default ``limit``) of a
    200 one (a server that ignores ``Range`` sends the whole shard; ``full_seconds`` is then
    the deadline); when more follows, the connection is dropped, unread. A short body is
    returned short: the caller compares it with what it asked for.

    Raises:
        TimeoutError: the deadline passed.
        urllib.error.HTTPError: the status is not 200 or 206.
        http.client.HTTPException, OSError: the request failed.
    """
    parts = urllib.parse.urlsplit(url)
    conns: dict[tuple[str, str], http.client.HTTPConnection] = _local.__dict__.setdefault("conns", {})
    key = (parts.scheme, parts.netloc)
    for attempt in range(2):
        conn = conns.pop(key, None)
        reused = conn is not None
        if conn is None:
            conn = _connection(parts, timeout)
        try:
            resp = _send(conn, parts, headers, deadline, method)
            if resp.status == 200 and full_seconds is not None:
                deadline.extend(full_seconds)
            wanted = limit if resp.status == 206 else (full_limit or limit) if resp.status == 200 else _ERROR_BODY
            body = resp.read(wanted)
            deadline.check()  # a body cut by the watchdog reads as short: say why
        except (http.client.HTTPException, OSError):
            conn.close()
            deadline.check()
            if reused and attempt == 0:
                continue  # closed by the server while idle: once more on a fresh connection
            raise
        if resp.isclosed() and not resp.will_close:  # the whole body read: the connection can serve the next one
            conns[key] = conn
        else:
            conn.close()
        if resp.status not in (200, 206):
            raise urllib.error.HTTPError(url, resp.status, resp.reason, resp.headers, io.BytesIO(body))
        return resp.status, resp.headers, body
    raise AssertionError("unreachable")


def open_stream(url: str, headers: dict[str, str], timeout: float,
                deadline: Deadline) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """GET ``url`` on a fresh connection of its own (a whole shard holds it a long time): the
    connection, to close after, and the response, its body unread.

    Raises:
        TimeoutError, urllib.error.HTTPError, http.client.HTTPException, OSError: as :func:`get`.
    """
    parts = urllib.parse.urlsplit(url)
    conn = _connection(parts, timeout)
    try:
        resp = _send(conn, parts, headers, deadline)
    except (http.client.HTTPException, OSError):
        conn.close()
        deadline.check()
        raise
    if resp.status != 200:
        conn.close()
        raise urllib.error.HTTPError(url, resp.status, resp.reason, resp.headers, None)
    return conn, resp


def _connection(parts: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.netloc, timeout=timeout, context=_TRUSTED.get(parts.netloc))
    return http.client.HTTPConnection(parts.netloc, timeout=timeout)


def _send(conn: http.client.HTTPConnection, parts: urllib.parse.SplitResult, headers: dict[str, str],
          deadline: Deadline, method: str = "GET") -> http.client.HTTPResponse:
    """Send the request under ``deadline`` (its socket bound to it) and read the status and headers."""
    if conn.sock is None:
        conn.connect()  # bounded by the socket timeout; bound to the deadline from here on
    deadline.bind(conn.sock)
    deadline.check()
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn.request(method, target, headers=headers)
    return conn.getresponse()
