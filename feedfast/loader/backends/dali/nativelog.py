"""DALI's native log lines routed to Python logging instead of the terminal.

DALI's image decoders (nvImageCodec and the libraries under it) write to the process's
standard error from native code: ``[ERROR] [libtiff_decoder] ...`` when one decoder fails
and another then decodes the image, ``libpng error: IDAT: CRC error`` when a batch fails
and feedfast rescues it (:mod:`feedfast.loader.backends.dali.rescue`). Python cannot intercept those
writes, so while a DALI pipeline of a loader is alive, feedfast points file descriptor 2 at
a pipe read by a small relay process (:mod:`feedfast.loader.backends.dali._relay`): lines that match
:data:`NATIVE` go to the ``feedfast.dali`` logger at INFO level (a run that succeeds prints
nothing of them), everything else (tracebacks, ``print(file=sys.stderr)``, progress bars)
reaches the real standard error unchanged. The relay is a process, not a thread, so what a
crashing process writes last still gets out. One relay serves every loader of a process;
the last loader's :meth:`Capture.release` puts file descriptor 2 back.

The check workers (:mod:`feedfast.checks.worker`) capture their decoders' output
themselves and attach it to the verdict's reason (the skip report's).
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

log = logging.getLogger("feedfast.dali")

NATIVE = (r"\[(ERROR|WARNING|WARN|INFO|DEBUG|TRACE|FATAL)\] \[[^\]]+\]"  # nvImageCodec, DALI's own
          r"|\[/\S+:\d+\] "  # DALI's C++ log prefix ([/opt/dali/...cc:123])
          r"|libpng (error|warning): |libtiff|Corrupt JPEG data: |Premature end of JPEG")
_RELAY = str(Path(__file__).with_name("_relay.py"))


class _Relay:
    """File descriptor 2 pointed at the relay process, and the thread that logs what it sends back."""

    def __init__(self) -> None:
        self.saved = os.dup(2)
        read_end, write_end = os.pipe()
        try:
            self.proc = subprocess.Popen([sys.executable, _RELAY, NATIVE], stdin=read_end, stdout=subprocess.PIPE,
                                         stderr=self.saved, close_fds=True)
        except OSError:
            os.close(self.saved)
            raise
        finally:
            os.close(read_end)
        sys.stderr.flush()
        os.dup2(write_end, 2)
        os.close(write_end)
        self.restored = False
        self.thread = threading.Thread(target=self._log, name="feedfast-native-log", daemon=True)
        self.thread.start()

    def _log(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            log.info("%s", line.decode("utf-8", "replace").rstrip())
        with _LOCK:  # the relay is gone: never leave standard error pointing at a pipe nobody reads
            self.restore()

    def restore(self) -> None:
        """Point file descriptor 2 back at the real standard error (the relay ends when its last writer closes)."""
        if self.restored:
            return
        self.restored = True
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # a closed or broken sys.stderr has nothing to flush: fd 2 is restored all the same
        os.dup2(self.saved, 2)
        os.close(self.saved)


# reentrant: a loader collected while a Capture is made (its __del__ releases its own) takes it again on this thread
_LOCK = threading.RLock()
_RELAY_NOW: _Relay | None = None
_USERS = 0


class Capture:
    """One user's hold on the relay; :meth:`release` is idempotent."""

    def __init__(self) -> None:
        global _RELAY_NOW, _USERS
        self.held = False
        with _LOCK:
            _release_deferred()
            if _RELAY_NOW is None or _RELAY_NOW.restored:
                try:
                    _RELAY_NOW = _Relay()
                except OSError as exc:  # no pipe or process to spare: DALI's lines stay on the terminal
                    log.debug("DALI's native log lines are not captured: %s", exc)
                    return
            _USERS += 1
            self.held = True

    def release(self) -> None:
        """Drop this hold; the last one puts standard error back.

        Never waits for another thread: a loader collected by the garbage collector runs this in
        whatever thread the collector ran on, for instance a thread being started by
        :class:`_Relay` while another thread holds the lock and waits for that start (seen: a
        deadlock). Then the release is left for the lock's next holder.
        """
        if not _LOCK.acquire(blocking=False):
            _DEFERRED.append(self)
            return
        try:
            _release_deferred()
            self._release()
        finally:
            _LOCK.release()

    def _release(self) -> None:
        global _RELAY_NOW, _USERS
        if not self.held:
            return
        self.held = False
        _USERS -= 1
        if _USERS == 0 and _RELAY_NOW is not None:
            _RELAY_NOW.restore()
            _RELAY_NOW = None


_DEFERRED: collections.deque[Capture] = collections.deque()


def _release_deferred() -> None:
    """The releases other threads left while the lock was held (the caller holds it)."""
    while _DEFERRED:
        _DEFERRED.popleft()._release()
