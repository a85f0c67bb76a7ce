"""A threaded HTTP server on 127.0.0.1 for tests and benchmarks: files of one folder, with Range.

``http.server.SimpleHTTPRequestHandler`` ignores ``Range``; this handler answers a single
``bytes=a-b`` range with 206, and sends ETag, Last-Modified and Content-Length. Faults can
be injected per path: ``server.faults["/a.tar"] = [500, 500]`` answers the next two GET or
HEAD requests for it with those statuses; the queue also takes what a broken server does to
the next GET (a HEAD passes these by):

- ``"drop"``, ``"drop:N"``: the headers promise the whole answer, then half its body (or N
  bytes) is sent and the connection closed (Python's ``read(n)`` returns such a body short);
- ``"trickle"``: the body a byte every ``server.trickle_every`` seconds, until the client hangs up;
- ``"oversize"``: a 206 that starts at the asked offset but runs ``server.oversize`` bytes
  (the shard's bytes, then zeros), whatever range was asked;
- ``"full"``: the whole file with 200, as a server that ignores ``Range`` does.

``server.redirects["/a.tar"] = "ftp://..."`` answers every request for that path with a
``302`` to the URL given.

``server.delay`` (seconds, default 0) holds every answer that long before its status line: a
slow server.

``server.requests`` logs (method, path, range); ``server.sent`` counts the body bytes sent.
"""

from __future__ import annotations

import email.utils
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class RangeServer:
    """Serve ``root`` on 127.0.0.1 (a free port) in a daemon thread; use as a context manager."""

    def __init__(self, root: str | os.PathLike[str], *, ignore_range: bool = False) -> None:
        self.root = Path(root)
        self.ignore_range = ignore_range
        self.faults: dict[str, list[int | str]] = {}
        self.redirects: dict[str, str] = {}
        self.delay = 0.0
        self.requests: list[tuple[str, str, str]] = []
        self.trickle_every = 0.05
        self.oversize = 300 << 20
        self.sent = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The base URL, without a trailing slash."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def urls(self, paths: list[str]) -> list[str]:
        """The URLs this server gives the files ``paths`` (of its root) by their names."""
        return [f"{self.url}/{os.path.basename(p)}" for p in paths]

    def __enter__(self) -> "RangeServer":
        self.thread.start()
        return self

    def count(self, sent: int) -> None:
        """Add to the body bytes sent."""
        with self.lock:
            self.sent += sent

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def fault(self, path: str, method: str) -> int | str | None:
        """The injected status or behaviour for the next request of ``path``, if any (a HEAD takes only statuses)."""
        with self.lock:
            queue = self.faults.get(path)
            if not queue or (method == "HEAD" and isinstance(queue[0], str)):
                return None
            return queue.pop(0)


def _handler(server: RangeServer) -> Any:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            return None

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            self._serve(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            rng = self.headers.get("Range", "")
            with server.lock:
                server.requests.append((self.command, self.path, rng))
            if server.delay:
                time.sleep(server.delay)
            if self.path in server.redirects:
                self.send_response(302)
                self.send_header("Location", server.redirects[self.path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            fault = server.fault(self.path, self.command)
            path = server.root / self.path.lstrip("/")
            if isinstance(fault, int) or not path.is_file():
                self.send_error(fault or 404)
                return
            st = path.stat()
            start, end = 0, st.st_size - 1
            m = _RANGE.match(rng)
            partial = bool(m) and not server.ignore_range and fault != "full"
            if partial and m:
                start, end = int(m.group(1)), min(int(m.group(2) or end), end)
            length, total = end - start + 1, st.st_size
            if fault == "oversize":
                partial, length = True, server.oversize
                total = max(total, start + length)
                end = start + length - 1
            self.send_response(206 if partial else 200)
            if partial:
                self.send_header("Content-Range", f"bytes {start}-{end}/{total}")
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{st.st_size:x}-{st.st_mtime_ns:x}"')
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
            self.end_headers()
            if not body:
                return
            self.wfile.flush()
            if fault is None:
                with open(path, "rb") as f:
                    self.connection.sendfile(f, start, length)
                server.count(length)
                return
            self.close_connection = True
            try:
                self._broken(fault, path, start, length)
            except OSError:
                pass  # the client hung up: what a deadline or a byte bound does

        def _broken(self, fault: str, path: Path, start: int, length: int) -> None:
            with open(path, "rb") as f:
                f.seek(start)
                if fault.startswith("drop"):
                    cut = int(fault.partition(":")[2] or length // 2)
                    self._send(f.read(cut))
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif fault == "trickle":
                    for _ in range(length):
                        self._send(f.read(1))
                        time.sleep(server.trickle_every)
                elif fault == "oversize":
                    sent = 0
                    while sent < length:
                        chunk = f.read(1 << 16) or bytes(min(1 << 16, length - sent))
                        self._send(chunk[: length - sent])
                        sent += len(chunk)
                elif fault == "full":
                    self._send(f.read(length))
                else:
                    raise ValueError(f"unknown fault {fault!r}")

        def _send(self, data: bytes) -> None:
            self.wfile.write(data)
            self.wfile.flush()
            server.count(len(data))

    return Handler


def main() -> None:
    """``python -m tests.rangeserver FOLDER``: serve FOLDER until killed; prints the URL on stdout."""
    import sys

    with RangeServer(sys.argv[1]) as srv:
        print(srv.url, flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
