"""The loader's settings that may change while it runs: threads at work and batches made ahead.

The threaded CPU path and the loader's producer thread read them live, so the tuner
(:mod:`feedfast.loader.autotune`) can change them between two batches with nothing restarted and
nothing made twice. Neither changes the data: each sample's augmentation is drawn from
(seed, epoch, position), whichever thread makes it and whenever.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Knobs:
    """Live settings: ``threads`` decoding at once and ``prefetch`` batches made ahead.

    ``max_threads`` and ``max_prefetch`` bound what a tuner may set (the pool and the buffers
    are sized for them when an epoch starts). ``cpu`` counts the CPU seconds the pool's threads
    spent on jobs and ``made`` the batches they finished (``counted`` once a :class:`LivePool`
    runs): the tuner's figure of the loader's own CPU per batch, where the process's total would
    also count the training step's threads, and batches consumed would miss those made ahead.
    """

    threads: int
    prefetch: int
    max_threads: int = 0
    max_prefetch: int = 0
    cpu: float = 0.0
    made: int = 0
    counted: bool = False
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False, compare=False)
    _cpu_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.max_threads = max(self.max_threads, self.threads)
        self.max_prefetch = max(self.max_prefetch, self.prefetch)

    def set(self, threads: int | None = None, prefetch: int | None = None) -> None:
        """Change settings within their bounds, waking whatever waits on them."""
        with self._changed:
            if threads is not None:
                self.threads = max(1, min(threads, self.max_threads))
            if prefetch is not None:
                self.prefetch = max(1, min(prefetch, self.max_prefetch))
            self._changed.notify_all()

    def count_cpu(self, seconds: float) -> None:
        """Add CPU seconds a loader thread spent on a job."""
        with self._cpu_lock:
            self.cpu += seconds

    def count_batch(self) -> None:
        """Count a batch the loader's threads finished."""
        with self._cpu_lock:
            self.made += 1

    def as_dict(self) -> dict[str, Any]:
        """``threads`` and ``prefetch``, as a state or a report carries them."""
        return {"threads": self.threads, "prefetch": self.prefetch}


class LivePool:
    """Worker threads that run jobs first in, first out; only the first ``knobs.threads`` of them take work.

    Jobs start in the order they were submitted whatever the thread count, so the chunks of
    the oldest batch run first and batches finish one after another (a semaphore in front of a
    larger pool would admit waiting chunks in any order, and finish batches in bursts).
    """

    def __init__(self, knobs: Knobs, name: str) -> None:
        self.knobs = knobs
        knobs.counted = True
        self._jobs: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, args=(i,), name=f"{name}_{i}", daemon=True)
                         for i in range(knobs.max_threads)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue ``fn(*args)``; it must handle its own exceptions."""
        with self.knobs._changed:
            self._jobs.append((fn, args))
            self.knobs._changed.notify_all()

    def _work(self, index: int) -> None:
        cond = self.knobs._changed
        while True:
            with cond:
                while not self._closed and (index >= self.knobs.threads or not self._jobs):
                    cond.wait()
                if self._closed:
                    return
                fn, args = self._jobs.popleft()
            started = time.thread_time()
            fn(*args)
            self.knobs.count_cpu(time.thread_time() - started)

    def shutdown(self) -> None:
        """Drop the jobs not started, and wait for the running ones."""
        with self.knobs._changed:
            self._closed = True
            self._jobs.clear()
            self.knobs._changed.notify_all()
        for t in self._threads:
            t.join()
