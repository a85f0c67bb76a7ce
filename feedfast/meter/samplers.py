"""Background samplers: the base thread and the CPU sampler (psutil).

A sampler runs in a daemon thread at about ``hz`` samples a second between
``start()`` and ``stop()``. When what it reads is not there (a module not installed, no
GPU) it reports ``status()`` ``"unavailable: <reason>"`` and its figures are None;
it never raises into the training loop. An error while sampling stops that sampler,
warns once, and is kept in ``status()``.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Protocol, runtime_checkable

SAMPLER_KEYS = (
    "cpu_util",
    "cpu_util_max",
    "cpu_per_core",
    "gpu_util",
    "gpu_util_max",
    "gpu_mem_mb",
    "gpu_mem_max_mb",
    "gpu_sm_active",
    "gpu_sm_active_max",
)
"""Figures the default samplers report; a summary always has them (None: unavailable)."""


class Unavailable(Exception):
    """Raised by a sampler's setup when what it reads is not there."""


@runtime_checkable
class Sampler(Protocol):
    """What the meter needs from a sampler."""

    name: str

    def start(self) -> None:
        """Begin sampling in the background (idempotent)."""

    def stop(self) -> None:
        """Stop sampling and wait for the thread (idempotent)."""

    def status(self) -> str:
        """``"ok"``, ``"not started"``, ``"unavailable: ..."`` or ``"failed: ..."``."""

    def figures(self) -> dict[str, Any]:
        """Means and maxima so far; values are None when unavailable."""


class Running:
    """Count, mean and maximum of a stream of numbers."""

    __slots__ = ("count", "max", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.max: float | None = None

    def add(self, value: float) -> None:
        """Take one value."""
        self.count += 1
        self.total += value
        self.max = value if self.max is None else max(self.max, value)

    @property
    def mean(self) -> float | None:
        """The mean, or None before any value."""
        return self.total / self.count if self.count else None


class ThreadSampler:
    """Base of the samplers: ``_open`` once, ``_sample`` every period, ``_close`` at the end.

    Args:
        hz: Samples per second.
    """

    name = "sampler"

    def __init__(self, *, hz: float = 10.0) -> None:
        self._period = 1.0 / hz
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status = "not started"
        self._lock = threading.Lock()

    def start(self) -> None:
        """Begin sampling in a daemon thread (a no-op while running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"feedfast-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and wait up to 5 s for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def status(self) -> str:
        """Say whether the sampler runs, or why not."""
        return self._status

    def figures(self) -> dict[str, Any]:
        """Means and maxima so far (subclasses)."""
        raise NotImplementedError

    def _open(self) -> None:
        """Set up; raise :class:`Unavailable` with a reason when it cannot."""

    def _sample(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        """Release what ``_open`` took."""

    def _run(self) -> None:
        try:
            self._open()
        except Unavailable as exc:
            self._status = f"unavailable: {exc}"
            return
        except Exception as exc:  # noqa: BLE001 - a sampler must not kill training
            self._fail(exc)
            return
        self._status = "ok"
        try:
            while not self._stop.is_set():
                with self._lock:
                    self._sample()
                self._stop.wait(self._period)
        except Exception as exc:  # noqa: BLE001 - a sampler must not kill training
            self._fail(exc)
        finally:
            self._close()

    def _fail(self, exc: Exception) -> None:
        self._status = f"failed: {type(exc).__name__}: {exc}"
        warnings.warn(
            f"feedfast StallMeter: {self.name} sampler stopped: {exc}", RuntimeWarning, stacklevel=1
        )


class CpuSampler(ThreadSampler):
    """CPU use of this process and its children, and of each core, through psutil.

    Figures: ``cpu_util`` and ``cpu_util_max`` (process tree, percent of all cores,
    0 to 100) and ``cpu_per_core`` (system-wide mean percent of each core).

    Args:
        hz: Samples per second.
    """

    name = "cpu"

    def __init__(self, *, hz: float = 10.0) -> None:
        super().__init__(hz=hz)
        self._util = Running()
        self._cores: list[Running] = []
        self._procs: dict[int, Any] = {}
        self._me: Any = None
        self._psutil: Any = None
        self._ncpu = 1

    def _open(self) -> None:
        try:
            import psutil
        except ImportError as exc:
            raise Unavailable("psutil is not installed (pip install psutil)") from exc
        self._psutil = psutil
        self._ncpu = psutil.cpu_count() or 1
        self._me = psutil.Process()
        self._me.cpu_percent(None)
        self._procs = {self._me.pid: self._me}
        psutil.cpu_percent(None, percpu=True)

    def _sample(self) -> None:
        psutil = self._psutil
        me = self._me
        tree = {me.pid: me}
        for child in me.children(recursive=True):
            tree[child.pid] = self._procs.get(child.pid, child)
        total = 0.0
        for pid, proc in tree.items():
            try:
                value = proc.cpu_percent(None)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if pid in self._procs:
                total += value
        self._procs = tree
        self._util.add(min(100.0, total / self._ncpu))
        per_core = psutil.cpu_percent(None, percpu=True)
        while len(self._cores) < len(per_core):
            self._cores.append(Running())
        for running, value in zip(self._cores, per_core, strict=False):
            running.add(value)

    def figures(self) -> dict[str, Any]:
        """CPU figures so far; None before the first sample or when unavailable."""
        with self._lock:
            return {
                "cpu_util": self._util.mean,
                "cpu_util_max": self._util.max,
                "cpu_per_core": [c.mean for c in self._cores] if self._cores else None,
            }
