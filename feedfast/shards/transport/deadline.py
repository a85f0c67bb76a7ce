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
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class Deadline:
    """One request's time limit: ``seconds`` from ``began`` (a :func:`time.monotonic` reading, default now: a
    retry counts from its fetch's first try); a context manager that registers it with the watchdog."""

    def __init__(self, seconds: float, what: str = "request", *, began: float | None = None) -> None:
        self.seconds, self.what = seconds, what
        self.at = (time.monotonic() if began is None else began) + seconds
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


def call_within(seconds: float, what: str, call: Callable[[], T], *, late: Callable[[T], None] | None = None) -> T:
    """``call()`` run on a thread of its own and waited for at most ``seconds``: for a client whose socket
    cannot be reached (fsspec's s3fs and gcsfs), the deadline a cut socket gives elsewhere.

    Past ``seconds`` it raises ``TimeoutError`` and the call is abandoned, not stopped: its thread
    (a daemon) runs on until the client's own timeouts end it, and what it returns then is dropped,
    handed to ``late`` first if given (to close a file the caller no longer holds). So ``call`` must
    touch nothing the caller uses after a timeout. Cost: one thread a call (about 0.1 ms).
    """
    finished = threading.Event()
    lock = threading.Lock()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, or dropped with the call
            box["error"] = exc
        with lock:
            finished.set()
            dropped = box.get("abandoned", False)
        if dropped and late is not None and "value" in box:
            late(box["value"])

    threading.Thread(target=run, name="feedfast-deadline-call", daemon=True).start()
    finished.wait(max(0.0, seconds))
    with lock:
        if not finished.is_set():
            box["abandoned"] = True
            raise TimeoutError(f"no complete answer to the {what} within its deadline ({max(0.0, seconds):.3g} s "
                               "were left; the call was abandoned to the client's own timeouts)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


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
