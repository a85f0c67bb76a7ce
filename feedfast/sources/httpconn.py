"""Kept-alive HTTP connections, one set per thread, for the many small Range requests of a stream.

urllib opens a new connection per request; a shuffled epoch asks for one range per
sample, so a TCP (and TLS) handshake per sample would cost more than the bytes. Each
reader thread keeps one connection per host. A request that fails on a reused connection
(the server closed it while idle) is sent once more on a fresh one at once; other
failures are left to the caller's retries. Responses that are not 200 or 206 raise
``urllib.error.HTTPError``, as urllib would. Redirects and proxies (``HTTP(S)_PROXY``)
are left to urllib: :func:`usable` says when this path applies.
"""

from __future__ import annotations

import http.client
import threading
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message

_local = threading.local()


def usable(url: str) -> bool:
    """Whether ``url`` can go over a kept-alive connection (http(s), no proxy configured for it)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return False
    proxies = urllib.request.getproxies()
    return parts.scheme not in proxies or bool(urllib.request.proxy_bypass(parts.hostname or ""))


def get(url: str, headers: dict[str, str], timeout: float, full_limit: int | None = None) -> tuple[int, Message, bytes]:
    """GET ``url`` on this thread's connection to its host: (status, headers, body).

    When the answer is a whole body (200) and ``full_limit`` is set, only that many bytes
    are read and the connection is dropped: a server that ignores ``Range`` is not read to
    the end of a large shard.
    """
    parts = urllib.parse.urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conns: dict[tuple[str, str], http.client.HTTPConnection] = _local.__dict__.setdefault("conns", {})
    key = (parts.scheme, parts.netloc)
    for attempt in range(2):
        conn = conns.pop(key, None)
        reused = conn is not None
        if conn is None:
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            conn = cls(parts.netloc, timeout=timeout)
        try:
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
            limit = full_limit if resp.status == 200 else None
            body = resp.read() if limit is None else resp.read(limit)
        except (http.client.HTTPException, OSError):
            conn.close()
            if reused and attempt == 0:
                continue  # closed by the server while idle: once more on a fresh connection
            raise
        if limit is None and not resp.will_close:
            conns[key] = conn
        else:
            conn.close()
        if resp.status not in (200, 206):
            raise urllib.error.HTTPError(url, resp.status, resp.reason, resp.headers, None)
        return resp.status, resp.headers, body
    raise AssertionError("unreachable")

