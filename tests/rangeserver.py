"""A threaded HTTP server on 127.0.0.1 for tests and benchmarks: files of one folder, with Range.

``http.server.SimpleHTTPRequestHandler`` ignores ``Range``; this handler answers a single
``bytes=a-b`` range with 206, and sends ETag, Last-Modified and Content-Length. Faults can
be injected per path: ``server.faults["/a.tar"] = [500, 500]`` answers the next two
requests for it with those statuses. ``server.requests`` logs (method, path, range).
"""

from __future__ import annotations

import email.utils
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class RangeServer:
    """Serve ``root`` on 127.0.0.1 (a free port) in a daemon thread; use as a context manager."""

    def __init__(self, root: str | os.PathLike[str], *, ignore_range: bool = False) -> None:
        self.root = Path(root)
        self.ignore_range = ignore_range
        self.faults: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The base URL, without a trailing slash."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "RangeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def fault(self, path: str) -> int | None:
        """The injected status for the next request of ``path``, if any."""
        with self.lock:
            queue = self.faults.get(path)
            return queue.pop(0) if queue else None


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
            status = server.fault(self.path)
            path = server.root / self.path.lstrip("/")
            if status is not None or not path.is_file():
                self.send_error(status or 404)
                return
            st = path.stat()
            start, end = 0, st.st_size - 1
            m = _RANGE.match(rng)
            partial = bool(m) and not server.ignore_range
            if partial and m:
                start, end = int(m.group(1)), min(int(m.group(2) or end), end)
            self.send_response(206 if partial else 200)
            if partial:
                self.send_header("Content-Range", f"bytes {start}-{end}/{st.st_size}")
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{st.st_size:x}-{st.st_mtime_ns:x}"')
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
            self.end_headers()
            if body:
                self.wfile.flush()
                with open(path, "rb") as f:
                    self.connection.sendfile(f, start, end - start + 1)

    return Handler


def main() -> None:
    """``python -m tests.rangeserver FOLDER``: serve FOLDER until killed; prints the URL on stdout."""
    import sys
    import time

    with RangeServer(sys.argv[1]) as srv:
        print(srv.url, flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
