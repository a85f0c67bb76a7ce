"""``gpu_check.py``'s guard against a hang: tracebacks when a section runs long, and an outer limit that ends the run.

The GPU lease is 15 minutes in all (the machine's start, the wheels, one run and a rerun),
so nothing may wait without end: every loader has a timeout (``Sizes.loader_timeout``),
and this watchdog thread covers what no timeout reaches (a CUDA call or a native decoder
that never returns). Past a section's limit it prints every thread's traceback
(``faulthandler``) once, so a hang says where it is; past the run's outer limit it prints
them again, has the JSON written as it stands (``on_limit``) and ends the process with exit
status 3, whatever the main thread is stuck in.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

KILLED = 3
"""Exit status when the outer limit ended the run."""


class Watchdog:
    """A daemon thread watching the run's outer limit and the running section's own.

    Args:
        limit_s: seconds from now after which the run is ended (tracebacks, ``on_limit()``, exit 3).
        on_limit: writes what was measured so far (called from the watchdog's thread).
        poll_s: how often the thread looks at the clock.
    """

    def __init__(self, limit_s: float, on_limit: Callable[[], None], poll_s: float = 0.25) -> None:
        self.limit_s = limit_s
        self._deadline = time.monotonic() + limit_s
        self._on_limit = on_limit
        self._poll = poll_s
        self._section: tuple[str, float] | None = None  # (name, deadline) of the running section
        self._reported: set[str] = set()
        self.hung: list[str] = []  # sections that ran past their limit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-check-watchdog", daemon=True)
        self._thread.start()

    def left(self) -> float:
        """Seconds until the outer limit."""
        return self._deadline - time.monotonic()

    @contextmanager
    def section(self, name: str, limit_s: float) -> Iterator[None]:
        """Watch one section: past ``limit_s`` (or the outer limit, if sooner) every thread's traceback is printed."""
        self._section = (name, time.monotonic() + min(limit_s, max(0.0, self.left())))
        try:
            yield
        finally:
            self._section = None

    def stop(self) -> None:
        """End the watch (the run finished)."""
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            now = time.monotonic()
            running = self._section
            if running is not None and now > running[1] and running[0] not in self._reported:
                self._reported.add(running[0])
                self.hung.append(running[0])
                dump(f"section {running[0]!r} is past its limit; every thread's stack:")
            if now > self._deadline:
                dump(f"the run is past its outer limit of {self.limit_s:g} s; ending it (exit {KILLED}) with "
                     "what it measured; every thread's stack:")
                try:
                    self._on_limit()
                finally:
                    sys.stderr.flush()
                    sys.stdout.flush()
                    os._exit(KILLED)


def dump(header: str) -> None:
    """``header`` and every thread's Python traceback on stderr (``faulthandler``'s, or ``traceback``'s where
    stderr is no file, as under a test's capture)."""
    print(f"[gpu-check] {header}", file=sys.stderr, flush=True)
    try:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is an OSError: no fileno
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            print(f"Thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}", file=sys.stderr)
        sys.stderr.flush()


def enable_crash_tracebacks() -> None:
    """``faulthandler.enable()``: a crash in native code prints every thread's traceback (where stderr is a file)."""
    try:
        faulthandler.enable()
    except (AttributeError, ValueError, OSError):
        return  # stderr is no file (a test's capture): nothing to write a crash to
