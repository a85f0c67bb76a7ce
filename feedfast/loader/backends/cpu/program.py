"""The backends that run a PIL program per sample: in threads (``threads``) or worker processes (``pil``).

Both resume from the step alone (their draws are per sample, :mod:`feedfast.order.draws`) and
yield host tensors; the threaded one starts the next epoch while the current one drains.
"""

from __future__ import annotations

import queue
import threading
from abc import abstractmethod
from typing import Any, Callable, Iterator

from feedfast.compile.pil import compile_pil
from feedfast.loader.backends.base import Backend, BackendSettings
from feedfast.loader.batch import Batch
from feedfast.order.deal import EpochPlan


class ProgramBackend(Backend):
    """A PIL program per sample on the CPU, its randomness per sample (it resumes from the step alone)."""

    pil_program = True
    cpu_only = True
    reads_by_range = True
    sources = frozenset({"shards", "folder"})  # reads a dataset's members through its own reader (dataset.members)

    def __init__(self, settings: BackendSettings) -> None:
        super().__init__(settings)
        self.plan, self.shards_for, self.plan_for = settings.plan, settings.shards_for, settings.plan_for
        self.program = compile_pil(self.plan.spec)  # once per loader, not per epoch
        self.ahead: tuple[int, StartedEpoch] | None = None  # the next epoch, started while this one drains

    @abstractmethod
    def _epoch(self, epoch: int, ep: EpochPlan, start: int) -> Iterator[Batch]:
        """The epoch's batches from step ``start``, made by this backend's run function."""

    def batches(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None) -> Iterator[Batch]:
        """The epoch's batches of host tensors; the state after each is its step (kept by the loader)."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead[0] == epoch and start == 0 and ep == self.plan_for(epoch):
            yield from ahead[1].take()
            return
        if ahead is not None:
            ahead[1].close()
        yield from self._epoch(epoch, ep, start)

    def _start(self, epoch: int, count: int) -> None:
        """Start making ``epoch``'s first ``count`` batches on a thread of their own while the current epoch drains."""
        if self.ahead is not None and self.ahead[0] == epoch:
            return
        self.close()
        ep = self.plan_for(epoch)
        self.ahead = (epoch, StartedEpoch(lambda: self._epoch(epoch, ep, 0), count))

    def close(self) -> None:
        """Stop and drop a started next epoch (its threads or worker processes end with it)."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            ahead[1].close()


class StartedEpoch:
    """An epoch's batches started ahead: the generator made, and its first ``count`` batches taken, on a thread.

    Each batch is handed over as soon as it is made (the first does not wait for the others), through
    a queue; after the ``count``-th the generator itself is handed over, so one thread at a time uses it.
    """

    def __init__(self, make: Callable[[], Iterator[Batch]], count: int) -> None:
        self._items: Iterator[Batch] | None = None
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(make, count), name="feedfast-next-epoch", daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], Iterator[Batch]], count: int) -> None:
        try:
            self._items = make()
            for _ in range(count):
                self._queue.put(("batch", next(self._items)))
        except StopIteration:
            self._queue.put(("end", None))
            return
        except BaseException as exc:  # noqa: BLE001 - re-raised by take(), in the epoch that asks for it
            self._queue.put(("error", exc))
            return
        self._queue.put(("rest", None))

    def take(self) -> Iterator[Batch]:
        """The batches made ahead as they come, then the rest of the epoch."""
        while True:
            kind, value = self._queue.get()
            if kind == "batch":
                yield value
            elif kind == "error":
                raise value
            elif kind == "end":
                return
            else:
                break
        self._thread.join()
        if self._items is not None:
            yield from self._items

    def close(self) -> None:
        """Wait for the start, then close the generator (its threads or worker processes end)."""
        self._thread.join()
        while not self._queue.empty():
            self._queue.get_nowait()
        close = getattr(self._items, "close", None)
        if callable(close):
            close()


class ThreadsBackend(ProgramBackend):
    """pillow-simd in threads (:mod:`.threads`); its threads and batches in flight are read live from the knobs,
    and the next epoch starts on a thread while this one drains."""

    name = "threads"
    tunable = ("threads", "prefetch")
    stop_at_exit = True  # its pool decodes in native code: stopped before the interpreter joins threads

    def _epoch(self, epoch: int, ep: EpochPlan, start: int) -> Iterator[Batch]:
        from feedfast.loader.backends.cpu.threads import run_thread_epoch

        s = self.settings
        return run_thread_epoch(self.plan, self.shards_for(epoch), ep, rank=s.rank, world=s.world,
                                batch_size=s.batch_size, workers=s.threads, seed=s.seed, epoch=epoch, start=start,
                                prefetch_factor=s.prefetch, knobs=s.knobs, program=self.program)

    def prepare(self, epoch: int) -> None:
        """Start ``epoch``'s first batches (as many as the knobs' batches ahead) while this epoch drains."""
        self._start(epoch, self.settings.knobs.prefetch)


class PilBackend(ProgramBackend):
    """The PIL program in torch DataLoader worker processes (:mod:`.pil`), the portable backend.

    It starts each epoch when asked, as torch's DataLoader does, never ahead: it forks worker
    processes, and forking from a second thread while the first epoch's workers and threads
    still ran crashed its workers (SIGSEGV).
    """

    name = "pil"
    host_normalize = True  # batches come out of worker processes normalized: nothing is deferred to the device

    @property
    def worker_processes(self) -> int:
        """The worker processes it forks per epoch (0: batches made in this process)."""
        return self.settings.workers

    def _epoch(self, epoch: int, ep: EpochPlan, start: int) -> Iterator[Batch]:
        from feedfast.loader.backends.cpu.pil import run_pil_epoch

        s = self.settings
        return run_pil_epoch(self.plan, self.shards_for(epoch), ep, rank=s.rank, world=s.world,
                             batch_size=s.batch_size, workers=s.workers, seed=s.seed, epoch=epoch, start=start,
                             prefetch_factor=s.prefetch, program=self.program)
