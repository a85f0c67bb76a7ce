"""Image checks in worker processes, each image under a time limit.

A hostile file can make a decoder loop for half a minute, write to the terminal, or
crash the process that decodes it. So feedfast checks images in a few worker processes
(``python feedfast/checks/decoders.py``): one image per job (or a batch of header checks,
which :mod:`feedfast.checks.images` asks again image by image when it fails), a
limit of CPU time per job (the worker is killed and replaced when it runs over: CPU time, so
that on a busy machine, where a valid file's check waits for a core, it is not failed; and at
most :data:`WALL_FACTOR` times the limit in wall time, for a worker that makes no progress), a crash is
a verdict like any other, and the workers' own output (DALI's ``[ERROR]`` lines, libpng warnings) goes to
Python logging at DEBUG level instead of the terminal.

Jobs are tuples: ``("check", data, max_pixels, decode[, complete])`` answers a
:class:`~feedfast.checks.decoders.Verdict`; ``("checks", [data, ...], max_pixels, decode,
[complete, ...])`` a batch's :class:`~feedfast.checks.decoders.Verdicts` (see
:mod:`feedfast.checks.images`); ``("png", data)`` answers PNG bytes or a
failure reason (a string); ``("rescue", data, max_pixels)`` (after DALI failed a batch)
answers a Verdict or a :class:`~feedfast.checks.decoders.Rescued` PNG; ``("decode", data,
max_pixels, color)`` (the second opinion of :mod:`feedfast.checks.second_decode`) answers
DALI's HWC uint8 pixels or a failure reason. The pool is shared by a process and started on
first use.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from feedfast import _env
from feedfast.checks import decoders
from feedfast.checks.decoders import Rescued, Verdict, Verdicts, read_message, with_decoder_output, write_message
from feedfast.errors import BackendError
from feedfast.spec.model import CHECK_SECONDS

log = logging.getLogger("feedfast.check")

DEFAULT_CHECK_SECONDS = CHECK_SECONDS  # the spec's ``source.check_seconds`` sets it per loader
_START_SECONDS = 60.0
WALL_FACTOR = 20.0
"""A job may take this many times its CPU-time limit in wall time (a starved worker), no more."""


@dataclass(frozen=True)
class Failed:
    """A job that produced no answer: it ran over its time limit or its worker died."""

    reason: str


class _Worker:
    """One worker process, its pipes and its captured output."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile()
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen([sys.executable, decoders.__file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env)
        self.started = time.monotonic()
        self.ready = False
        self.job: tuple[int, float] | None = None  # (job number, deadline)
        self.began = (0.0, 0.0)  # (wall clock, CPU seconds) when the current job was sent
        self.label = ""  # what the current job checks, for the log

    def send(self, job: Any) -> None:
        assert self.proc.stdin is not None
        write_message(self.proc.stdin, job)

    def cpu_seconds(self) -> float | None:
        """CPU time the worker has used (all its threads), None when it cannot be read."""
        import psutil

        try:
            times = psutil.Process(self.proc.pid).cpu_times()
        except (psutil.Error, OSError):
            return None
        return float(times.user + times.system)

    def begin(self, number: int, seconds: float) -> None:
        """Mark job ``number`` as sent now, due after ``seconds`` of wall time (then its CPU time is read)."""
        now = time.monotonic()
        self.began = (now, self.cpu_seconds() or 0.0)
        self.job = (number, now + seconds)

    def extended(self, now: float, seconds: float) -> bool:
        """At the job's deadline: whether it used less than ``seconds`` of CPU time (a busy machine) and may
        run on, within ``WALL_FACTOR * seconds`` of wall time; if so its deadline moves to the earliest time
        it could have used them."""
        used = self.cpu_seconds()
        if self.job is None or used is None or now - self.began[0] >= WALL_FACTOR * seconds:
            return False
        left = seconds - (used - self.began[1])
        if left <= 0:
            return False
        self.job = (self.job[0], min(now + max(left, 0.02), self.began[0] + WALL_FACTOR * seconds))
        return True

    def receive(self) -> Any:
        assert self.proc.stdout is not None
        return read_message(self.proc.stdout)

    def drain_log(self, what: str) -> str:
        """Route what the worker printed since the last call to logging, and return it."""
        self.log.seek(0)
        text = self.log.read().decode("utf-8", "replace").strip()
        self.log.seek(0)
        self.log.truncate()
        if text:
            log.debug("decoder output while checking %s:\n%s", what, text)
        return text

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is None:
                continue
            try:
                pipe.close()
            except OSError:  # a dead worker's stdin: what was not sent dies with it (BrokenPipeError on flush)
                continue
        self.log.close()


class CheckPool:
    """A few worker processes that run check jobs, each under ``seconds`` of CPU time (see the module)."""

    def __init__(self, size: int, seconds: float = DEFAULT_CHECK_SECONDS) -> None:
        self.size, self.seconds = max(1, size), seconds
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._start_failures = 0
        self._pid = os.getpid()  # a forked child must not use (or kill) its parent's workers

    def map(self, jobs: Iterable[Any], *, labels: Iterable[str] | None = None,
            seconds: float | None = None) -> Iterator[Any]:
        """Answers to ``jobs`` in order: each worker's answer, or :class:`Failed`."""
        with self._lock:
            yield from self._map(iter(jobs), iter(labels) if labels is not None else None,
                                 self.seconds if seconds is None else seconds)

    def start(self) -> None:
        """Start the workers now, without waiting for them (they import DALI and build its pipelines, about
        a second): a caller about to open shards lets that run while it indexes them."""
        with self._lock:
            while len(self._workers) < self.size:
                self._workers.append(_Worker())

    def _map(self, jobs: Iterator[Any], labels: Iterator[str] | None, seconds: float) -> Iterator[Any]:
        while len(self._workers) < self.size:
            self._workers.append(_Worker())
        pending: deque[tuple[int, Any, str]] = deque()
        answers: dict[int, Any] = {}
        issued = emitted = 0
        exhausted = False
        sel = selectors.DefaultSelector()
        try:
            while True:
                while not exhausted and len(pending) < 2 * self.size:
                    job = next(jobs, None)
                    if job is None:
                        exhausted = True
                        break
                    pending.append((issued, job, next(labels, f"job {issued}") if labels else f"job {issued}"))
                    issued += 1
                self._assign(pending, sel, seconds)
                while emitted in answers:
                    yield answers.pop(emitted)
                    emitted += 1
                if exhausted and emitted == issued:
                    return
                self._wait(sel, answers, seconds)
        finally:
            for i, w in enumerate(self._workers):
                if w.job is not None:  # abandoned mid-way: its answer must not reach the next caller
                    w.job = None
                    self._replace(i, sel)
            sel.close()

    def _assign(self, pending: deque[tuple[int, Any, str]], sel: selectors.BaseSelector, seconds: float) -> None:
        for i, w in enumerate(self._workers):
            if w.job is None and pending and w.ready:
                number, job, label = pending.popleft()
                try:
                    w.send(job)
                    w.begin(number, seconds)
                    w.label = label
                except OSError:  # it died while idle: a fresh worker takes the job once it has started
                    pending.appendleft((number, job, label))
                    self._replace(i, sel)
                    w = self._workers[i]
            if w.proc.stdout is not None and not _registered(sel, w):
                sel.register(w.proc.stdout, selectors.EVENT_READ, w)

    def _wait(self, sel: selectors.BaseSelector, answers: dict[int, Any], seconds: float) -> None:
        now = time.monotonic()
        deadlines = [w.job[1] for w in self._workers if w.job] + \
                    [w.started + _START_SECONDS for w in self._workers if not w.ready]
        timeout = max(0.0, min(deadlines, default=now + 1) - now)
        for key, _ in sel.select(timeout):
            w = key.data
            try:
                answer = w.receive()
            except (EOFError, OSError, pickle.UnpicklingError):
                if not w.ready:
                    self._start_failed(w)
                self._died(w, sel, answers, f"the decoder crashed (exit status {w.proc.wait()})")
                continue
            if not w.ready:
                w.ready = True
                w.drain_log("start-up")
                continue
            if w.job is not None:
                answers[w.job[0]] = with_decoder_output(_unpack(answer), w.drain_log(w.label))
                w.job = None
        now = time.monotonic()
        for w in list(self._workers):
            if w.job is not None and now > w.job[1] and not w.extended(now, seconds):
                self._died(w, sel, answers, f"checking took longer than {seconds:g} s of CPU time (a hostile or "
                                            "huge file)")
            elif not w.ready and now > w.started + _START_SECONDS:
                raise BackendError(f"an image check worker did not start within {_START_SECONDS:g} s")

    def _start_failed(self, w: _Worker) -> None:
        self._start_failures += 1
        if self._start_failures >= 3:
            said = w.drain_log("start-up")
            raise BackendError(f"image check workers exit as they start ({sys.executable} {decoders.__file__}): "
                               f"{said.splitlines()[-1] if said else 'no output'}")

    def _died(self, w: _Worker, sel: selectors.BaseSelector, answers: dict[int, Any], reason: str) -> None:
        if w.job is not None:
            answers[w.job[0]] = Failed(reason)
            w.job = None
        self._replace(self._workers.index(w), sel)

    def _replace(self, i: int, sel: selectors.BaseSelector) -> None:
        w = self._workers[i]
        if w.proc.stdout is not None and _registered(sel, w):
            sel.unregister(w.proc.stdout)
        w.drain_log(w.label) if not w.log.closed else None
        w.kill()
        self._workers[i] = _Worker()

    def close(self) -> None:
        """Stop every worker (in the process that started them; a forked copy just forgets them)."""
        workers, self._workers = self._workers, []
        if os.getpid() != self._pid:
            return
        for w in workers:
            w.kill()


_OK = Verdict("ok")  # one object for the many plain verdicts of a batch


def _unpack(answer: Any) -> Any:
    """A worker's plain answer as a Verdict, a Rescued PNG, PNG bytes or a failure reason."""
    if answer[0] == "verdict":
        return Verdict(answer[1], answer[2])
    if answer[0] == "verdicts":
        return Verdicts(tuple(_OK if status == "ok" and not reason else Verdict(status, reason)
                              for status, reason in answer[1]))
    if answer[0] == "rescued":
        return Rescued(answer[1], answer[2])
    return answer[1]


def _registered(sel: selectors.BaseSelector, w: _Worker) -> bool:
    try:
        sel.get_key(w.proc.stdout)  # type: ignore[arg-type]
        return True
    except KeyError:
        return False


_POOL: CheckPool | None = None


def pool() -> CheckPool:
    """The process's check pool (as many workers as usable cores, at most 4), started on first use."""
    global _POOL
    if _POOL is not None and _POOL._pid != os.getpid():
        _POOL = None  # forked: the workers' pipes belong to the parent
    if _POOL is None:
        _POOL = CheckPool(min(4, _env.usable_cores()))
        atexit.register(_POOL.close)
    return _POOL


