"""Overall deadlines for network requests: a watchdog thread that cuts the socket of a request past its time.

A socket timeout bounds one read, not a request: a server that trickles a byte every few
seconds answers every read in time and can hold a request for days. Each request takes a
:class:`Deadline` (``with Deadline(seconds) as d: d.bind(sock)``); one watchdog thread per
process, started with the first, shuts down the bound socket when the time has passed, so
the blocked read returns at once, and the request sees :attr:`Deadline.expired` and raises
``TimeoutError`` (:meth:`Deadline.check`). A request whose body grows can push its deadline
back (:meth:`Deadline.extend`: a minimum transfer rate over a long download). What is not a
socket takes its own way to be stopped (:meth:`Deadline.bind_stop`: a ``pipe:`` command's
process group is killed, so its stdout ends and the blocked read returns).

Cost per request: two dictionary updates under a lock; the watchdog wakes at the earliest
deadline (about once per deadline while requests come and go), not once per request.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from functools import partial
from typing import Any, Callable


class Deadline:
    """One request's time limit (seconds from now); a context manager that registers it with the watchdog."""

    def __init__(self, seconds: float, what: str = "request") -> None:
        self.seconds, self.what = seconds, what
        self.at = time.monotonic() + seconds
        self.expired = False
        self._stop: Callable[[], None] | None = None

    def __enter__(self) -> "Deadline":
        _WATCHDOG.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _WATCHDOG.remove(self)

    def bind(self, sock: Any) -> None:
        """The socket to shut down when the deadline passes (at once, if it has passed)."""
        self.bind_stop(partial(_shut, sock) if isinstance(sock, socket.socket) else None)

    def bind_stop(self, stop: Callable[[], None] | None) -> None:
        """What stops the request when the deadline passes (at once, if it has passed): it must make the
        blocked read return, and be quick (it runs on the watchdog thread)."""
        with _WATCHDOG.cond:
            self._stop = stop
            if self.expired:
                self._cut()

    def extend(self, seconds: float) -> None:
        """Move the deadline to ``seconds`` after the request began (never earlier than it is)."""
        with _WATCHDOG.cond:
            self.at = max(self.at, self.at - self.seconds + seconds)
            self.seconds = max(self.seconds, seconds)

    def check(self) -> None:
        """Raise ``TimeoutError`` if the deadline has passed."""
        if self.expired or time.monotonic() > self.at:
            self.expired = True
            raise TimeoutError(f"no complete answer to the {self.what} within its deadline of {self.seconds:.3g} s")

    def _fire(self) -> None:
        self.expired = True
        self._cut()

    def _cut(self) -> None:
        if self._stop is not None:
            self._stop()


def _shut(sock: socket.socket) -> None:
    try:  # socket.socket's own shutdown, also for an SSL socket: its reader sees the end of the stream
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: nothing left to stop


class _Watchdog:
    """The thread that fires deadlines; it sleeps until the earliest one and only while there are any."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active: dict[int, Deadline] = {}
        self.wake_at = float("inf")
        self.thread: threading.Thread | None = None

    def add(self, deadline: Deadline) -> None:
        with self.cond:
            self.active[id(deadline)] = deadline
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="feedfast-deadlines", daemon=True)
                self.thread.start()
            if deadline.at < self.wake_at:
                self.cond.notify()

    def remove(self, deadline: Deadline) -> None:
        with self.cond:
            self.active.pop(id(deadline), None)

    def _run(self) -> None:
        with self.cond:
            while True:
                now = time.monotonic()
                for d in [d for d in self.active.values() if d.at <= now]:
                    del self.active[id(d)]
                    d._fire()
                self.wake_at = min((d.at for d in self.active.values()), default=float("inf"))
                self.cond.wait(None if self.wake_at == float("inf") else self.wake_at - now)


_WATCHDOG = _Watchdog()


def _after_fork() -> None:
    """A forked child has no watchdog thread, and its lock may have been held by another thread: start afresh."""
    global _WATCHDOG
    _WATCHDOG = _Watchdog()


os.register_at_fork(after_in_child=_after_fork)
