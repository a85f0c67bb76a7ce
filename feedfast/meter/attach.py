"""The in-process side of ``feedfast watch``: a StallMeter per loader of the job, written out at exit.

:mod:`feedfast.meter.startup.sitecustomize` calls :func:`agent` the first time a process of
the job iterates a DataLoader, then drives one :class:`Tracker` per loader; a loader is named
by where the job built it (``train.py:57``), so the loaders one line builds epoch after
epoch, or that Lightning rebuilds with a sampler, are one loader.

What a tracker measures:

* the loader's first batch is taken unmeasured; the meter starts at the second, once the job
  has had a step to set up CUDA. Its basis is ``gpu-events`` (CUDA events on the stream
  current at each wait: the loop's) when the process has initialised CUDA by then, else
  ``host-wait``. The meter's warm-up (its first 10 steps) is left out of every figure;
* ``iter()`` of a later epoch counts in that epoch's first wait (workers start there); a wait
  that ends in StopIteration is dropped; the step still open at exit is left out, since
  where it ended is not known (a ``break``, then an evaluation, a save);
* ``FEEDFAST_WATCH_STEPS`` > 0: after that many batches the tracker stops measuring and the
  process writes its figures at once;
* ``FEEDFAST_WATCH_EVERY`` > 0: a line on stderr every that many steps.

Per process, one CPU sampler (psutil) and one NVML sampler (the GPU current when the first
meter starts, found in the training thread) run at 2 and 5 samples a second.

A process that iterated a loader writes ``proc-<pid>.json`` in ``FEEDFAST_WATCH_DIR``
(:meth:`Agent.record`, through a temporary file renamed into place): as it goes, at the first
step that ends :data:`FLUSH_S` seconds after its last write, or longer (:data:`FLUSH_SHARE`)
(``"end": "running"``); on SIGTERM
(``"end": "SIGTERM"``: the handler is chained before the job's own, or before the default, which
then ends the job with the same status); in ``os._exit`` (wrapped: ``"end": "os._exit"``); and at
exit (``atexit``, and multiprocessing's exit for a forked ``Process``: ``"end": "exit"``). A process
that ends otherwise (SIGKILL, the OOM killer) leaves its last write, :data:`FLUSH_S` seconds
old at most in a run's first hours, still marked ``running``. The report names every process whose last write is not
``exit`` as ended abruptly. A forked child starts with no trackers.

Cost: the hook's wrapper and the meter's two marks, 2 to 4 us a step on host waits on this
project's 2-core test machine (half of it finding the batch size), a few more with CUDA events;
:func:`feedfast.meter.hookcost.hook_overhead` measures it. The writes as it goes add one clock
read a step (0.05 us), and a write in the job's thread (counted in a step, never in a wait; it
grows with the steps measured, the summary being computed afresh: 8 to 12 ms at 10,000 steps) every
:data:`FLUSH_S` seconds, or less often so that the writes take at most :data:`FLUSH_SHARE` of the
run. Importing feedfast's meter in a process that iterates a loader costs about half a second, once.

Limits: a loader read in a thread of its own (a prefetcher feeding a queue) is measured in that
thread, so its waits are the prefetcher's, not the loop's; the loaders one line builds are one
row, whatever their datasets.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time
from functools import partial
from typing import Any, NoReturn

from feedfast import _env
from feedfast.errors import UserError
from feedfast.meter import report
from feedfast.meter.events import CudaEvents
from feedfast.meter.loaderfacts import feedfast_facts, torch_facts
from feedfast.meter.meter import StallMeter
from feedfast.meter.nvml import NvmlSampler
from feedfast.meter.rankplot import thin
from feedfast.meter.samplers import CpuSampler, Sampler
from feedfast.meter.watchenv import RECORD_VERSION, WatchSettings

SERIES_POINTS = 20_000
"""Per-step series longer than this are written as bucket maxima (for ``--plot``)."""
FLUSH_S = 2.0
"""A process writes its figures as it goes, at the first step this many seconds after its last write."""
FLUSH_SHARE = 0.005
"""... or later, so that those writes take at most this share of the run's time (a write grows with the steps)."""


class JobMeter(StallMeter):
    """A StallMeter that gives its per-step series and stays quiet about batches it cannot size.

    The job's own output is not the place for the meter's warning; the table counts such
    steps (``unsized_steps``).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._warned_unsized = True

    def series(self) -> dict[str, Any]:
        """Each complete step's wait (on the basis) and step time, seconds, thinned to bucket maxima."""
        self._log.poll()
        waits, _, steps = self._log.series()
        stride = max(1, -(-len(waits) // SERIES_POINTS))
        return {"stride": stride, "wait_s": thin(waits, stride), "step_s": thin(steps, stride)}


class Tracker:
    """One loader's marks: the start-up hook calls ``iter_begin`` in ``__iter__``, then ``begin``/``end``/``cancel``
    around each ``next()``."""

    __slots__ = ("_agent", "_iter_open", "_limit", "_seen", "done", "facts", "kind", "meter", "site")

    def __init__(self, agent: Agent, site: str, kind: str, facts: dict[str, Any], limit: int) -> None:
        self._agent, self.site, self.kind, self.facts, self._limit = agent, site, kind, facts, limit
        self.meter: JobMeter | None = None
        self.done = False
        self._iter_open = False
        self._seen = False

    def iter_begin(self) -> None:
        """``iter(loader)`` begins: a measured epoch's first wait starts here."""
        if self.meter is not None and not self.done:
            self.meter.wait_begin()
            self._iter_open = True

    def begin(self) -> bool:
        """``next()`` begins; returns whether this wait is measured (then ``end`` or ``cancel`` follows)."""
        if self._iter_open:
            self._iter_open = False
            return True
        meter = self.meter
        if meter is None:
            if not self._seen:  # the first batch: unmeasured
                self._seen = True
                return False
            meter = self.meter = self._agent.new_meter(self)
        elif self.done:
            return False
        if self._limit and meter.wait_count >= self._limit:
            meter.step_end()
            self.done = True
            self._agent.write(final=False)
            return False
        meter.wait_begin()
        return True

    def end(self, batch: Any) -> None:
        """The batch is in hand; the process's figures are written when :data:`FLUSH_S` passed since the last write."""
        self.meter.wait_end(batch)  # type: ignore[union-attr]  # begin() returned True: there is a meter
        if time.monotonic() >= self._agent.flush_at:
            self._agent.write(final=False)

    def cancel(self) -> None:
        """The wait ended without a batch (StopIteration, an error)."""
        self._iter_open = False
        if self.meter is not None:
            self.meter.wait_cancel()


class Agent:
    """The process's trackers, samplers and record."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.trackers: dict[tuple[str, str], Tracker] = {}
        self._samplers: list[Sampler] = []
        self._pid = os.getpid()
        self._dist: tuple[int, int] | None = None
        self._hooked = False
        self._written = False
        self.flush_at = time.monotonic() + FLUSH_S
        """When the next step writes the figures as they stand (:meth:`Tracker.end`)."""
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child: nothing measured yet (its parent's meters stay its parent's)."""
        self.trackers, self._samplers, self._pid = {}, [], os.getpid()
        self._hooked = self._written = False
        self.flush_at = time.monotonic() + FLUSH_S

    def tracker(self, loader: Any, kind: str, built_at: tuple[str, int] | None) -> Tracker:
        """The tracker of ``loader``, built at ``(file, line)``; notes the rank while torch.distributed is up."""
        self._note_rank()
        file, line = built_at or ("<unknown>", 0)
        site = f"{_shown(file)}:{line}"
        tracker = self.trackers.get((site, kind))
        if tracker is None:
            if not self._hooked:
                self._hooked = True
                atexit.register(self.write)
                from multiprocessing import util

                util.Finalize(self, self.write, exitpriority=100)  # a forked Process's exit skips atexit
                self._chain_sigterm()
                self._wrap_os_exit()
            facts = torch_facts(loader) if kind == "torch" else feedfast_facts(loader)
            tracker = self.trackers[(site, kind)] = Tracker(self, site, kind, facts, self.settings.steps)
        return tracker

    def _chain_sigterm(self) -> None:
        """Write the figures on SIGTERM, then hand the signal on as it was: to the job's own handler, else to the
        default (the job dies of it, with the same status). Not where the job ignores SIGTERM, where a handler
        from C code (Python cannot call it) holds it, or off the main thread (Python cannot set one there)."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous is None or previous == signal.SIG_IGN:
            return
        try:
            signal.signal(signal.SIGTERM, partial(self._on_sigterm, previous))
        except (ValueError, OSError) as exc:
            print(f"feedfast watch: pid {self._pid} writes nothing on SIGTERM: {exc}", file=sys.stderr)

    def _wrap_os_exit(self) -> None:
        """``os._exit`` writes the figures first (scripts end with it to skip a slow DataLoader teardown; a forked
        worker's exit through it writes nothing: it has no trackers)."""
        real = os._exit
        if getattr(real, "feedfast_watch", False):
            return

        def _exit(status: int) -> NoReturn:
            self.write(end="os._exit")
            real(status)

        _exit.feedfast_watch = True  # type: ignore[attr-defined]
        os._exit = _exit

    def _on_sigterm(self, previous: Any, signum: int, frame: Any) -> None:
        if not callable(previous):  # the default: the figures are final, then the job dies of the signal
            self.write(end="SIGTERM")
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.write(final=False, end="SIGTERM")  # the job's handler may end the job, or only ask its loop to stop
        previous(signum, frame)

    def _note_rank(self) -> None:
        torch = sys.modules.get("torch")
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            self._dist = (dist.get_rank(), dist.get_world_size())

    def new_meter(self, tracker: Tracker) -> JobMeter:
        """A meter for ``tracker``, at its loader's second batch: CUDA events if the process uses CUDA."""
        import torch

        if not self._samplers:
            self._start_samplers(torch)
        cuda = torch.cuda.is_initialized()
        tracker.facts["grad_enabled"] = torch.is_grad_enabled()
        tracker.facts["cuda"] = cuda
        every = self.settings.every
        return JobMeter(window=every or 100, every=every, callback=partial(self._live, tracker) if every else None,
                        device="cpu", events=CudaEvents() if cuda else None, samplers=False)

    def _start_samplers(self, torch: Any) -> None:
        uuid = None
        if torch.cuda.is_initialized():  # the training thread's device; the sampler's own thread would see GPU 0
            try:
                uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
                uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            except (RuntimeError, AttributeError) as exc:
                print(f"feedfast watch: NVML samples GPU 0: torch could not name its GPU ({exc})", file=sys.stderr)
        self._samplers = [CpuSampler(hz=2.0), NvmlSampler(uuid=uuid, hz=5.0)]
        for sampler in self._samplers:
            sampler.start()

    def _live(self, tracker: Tracker, figures: dict[str, float]) -> None:
        """The ``--every`` line: steps so far (the warm-up's included), the data wait over the last ones."""
        meter = tracker.meter
        if meter is None:
            return
        stall, size = figures.get("window/stall_fraction"), int(figures.get("window/steps", 0))
        shown = "in warm-up" if stall is None else f"data wait {stall:.1%} over the last {size}"
        try:
            print(f"feedfast watch: rank {self._rank()[0]} {tracker.site}: {meter.wait_count} steps, {shown} "
                  f"({meter.basis})", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr closed: there is nowhere to say it, and the job's loop goes on
            return

    def _rank(self) -> tuple[int, int, int]:
        """(rank, world size, local rank): torch.distributed's when it was up, else the launcher's variables."""
        try:
            rank, world, local = _env.launcher_rank()
        except UserError:  # a malformed variable is the job's to report, not the meter's
            rank, world, local = 0, 1, 0
        if self._dist is not None:
            rank, world = self._dist
        return rank, world, local

    def record(self, end: str = "exit") -> dict[str, Any]:
        """This process's figures: who it is, its machine, its samplers, and per loader its facts and summary.

        ``end``: how the process stood when it wrote them: ``exit`` (its last write), ``running`` (written as it
        went: a process whose last write says so ended abruptly), ``SIGTERM``.
        """
        import torch

        rank, world, local = self._rank()
        usage: dict[str, Any] = {}
        for sampler in self._samplers:
            usage.update(sampler.figures())
        loaders = []
        for tracker in self.trackers.values():
            entry: dict[str, Any] = {"site": tracker.site, "kind": tracker.kind, **tracker.facts,
                                     "summary": tracker.meter.summary() if tracker.meter is not None else None}
            if self.settings.series and tracker.meter is not None:
                entry["series"] = tracker.meter.series()
            loaders.append(entry)
        return {"version": RECORD_VERSION, "pid": self._pid, "end": end, "written_at": time.time(),
                "host": socket.gethostname(), "rank": rank,
                "world_size": world, "local_rank": local, "argv": list(sys.argv), "cores": _env.usable_cores(),
                "cuda": bool(torch.cuda.is_initialized()), "usage": usage,
                "samplers": {s.name: s.status() for s in self._samplers}, "loaders": loaders}

    def write(self, *, final: bool = True, end: str | None = None) -> None:
        """Write ``proc-<pid>.json`` (at exit, on SIGTERM, when ``--steps`` is reached, and as it goes, every
        :data:`FLUSH_S` seconds or :data:`FLUSH_SHARE`); never raises into the job. ``end`` (default ``exit`` when
        final, else ``running``): see :meth:`record`."""
        started = time.monotonic()
        self.flush_at = started + FLUSH_S
        if self._written or os.getpid() != self._pid or not self.trackers:
            return
        try:
            if final:
                self._written = True
                self._settle()
            path = self.settings.run_dir / f"proc-{self._pid}.json"
            end = end or ("exit" if final else "running")
            temporary = path.with_suffix(f".{end}.tmp")  # a SIGTERM's write may land inside a running one's
            report.to_json(self.record(end), temporary)
            os.replace(temporary, path)
            self.flush_at = started + max(FLUSH_S, (time.monotonic() - started) / FLUSH_SHARE)
        except Exception as exc:  # noqa: BLE001 - the job's exit must stay the job's
            print(f"feedfast watch: pid {self._pid} could not write its figures: {type(exc).__name__}: {exc}",
                  file=sys.stderr)

    def _settle(self) -> None:
        """Let the GPU reach the last events, stop the samplers."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            try:
                torch.cuda.synchronize()
            except RuntimeError as exc:  # a job that failed on the GPU: its last events stay pending
                print(f"feedfast watch: CUDA did not synchronize at exit ({exc})", file=sys.stderr)
        for sampler in self._samplers:
            sampler.stop()


def _shown(path: str) -> str:
    """``path`` relative to the working folder when it is inside it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith(os.pardir) else relative


_AGENT: Agent | None = None


def agent() -> Agent | None:
    """The process's agent, made on first call; None when ``FEEDFAST_WATCH_DIR`` is not set (not under watch)."""
    global _AGENT
    if _AGENT is None:
        settings = WatchSettings.from_env(os.environ)
        _AGENT = Agent(settings) if settings is not None else None
    return _AGENT
