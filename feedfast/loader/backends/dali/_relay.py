"""The relay process of :mod:`feedfast.loader.backends.dali.nativelog`: standard error in, sorted out.

Run as ``python _relay.py PATTERN`` (a file path: it imports nothing of feedfast). It reads
what the parent process writes to its standard error (stdin here) and writes each line that
PATTERN matches once ANSI colours are removed (a native log line) to stdout, which the parent
reads into Python logging; everything else goes on to the parent's real standard error (this
process's stderr), at once when it is not the start of a native line. When the parent is
gone (stdout closed) native lines go to stderr too, so a crash report is never lost. It ends
when every writer of its stdin has closed it.
"""

from __future__ import annotations

import os
import re
import select
import signal
import sys

_ANSI = re.compile(rb"\x1b\[[0-9;]*m")
_MAYBE_NATIVE = (b"\x1b[", b"[", b"lib", b"Corrupt", b"Premature")
HOLD_SECONDS = 0.2  # how long the start of a line that may be native waits for its end


def main(pattern: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; this ends at EOF
    native = re.compile(pattern)
    err, out = sys.stderr.buffer, sys.stdout.buffer
    to_parent = True
    pending = b""

    def route(line: bytes) -> None:
        nonlocal to_parent
        text = _ANSI.sub(b"", line).decode("utf-8", "replace").strip()
        if to_parent and native.match(text):
            try:
                out.write(text.encode("utf-8") + b"\n")
                out.flush()
                return
            except (BrokenPipeError, OSError):
                to_parent = False
        err.write(line)
        err.flush()

    while True:
        ready, _, _ = select.select([0], [], [], HOLD_SECONDS if pending else None)
        if not ready:  # a partial line waited long enough: it goes on as it is
            route(pending)
            pending = b""
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            route(line + b"\n")
        if pending and not pending.startswith(_MAYBE_NATIVE):
            route(pending)
            pending = b""
    if pending:
        route(pending)


if __name__ == "__main__":
    main(sys.argv[1])
