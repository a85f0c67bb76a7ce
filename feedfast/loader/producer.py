"""Run a batch producer on a background thread, a bounded number of batches ahead of the consumer.

The training thread's ``next()`` then only takes a finished batch off a queue: reading DALI's
outputs, staging into pinned memory, host ops (labels, keys), the host-to-device copy and the
next epoch's pipeline build all happen on the producer thread while the training step runs.
DALI, PIL and torch release the GIL in their heavy calls, so the two threads overlap.

A failure in the producer is re-raised by the consumer's ``next()`` as the same exception
(a :class:`~feedfast.errors.FeedfastError` keeps its shard and sample), after the batches
produced before it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Generic, Iterator, TypeVar

from feedfast.errors import FeedfastError

T = TypeVar("T")

_END = object()


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Ahead(Generic[T]):
    """Iterate ``produce()`` on a daemon thread, holding at most ``depth`` finished items.

    Args:
        produce: makes the iterator to run; it is created, iterated and closed on the thread.
        depth: finished items the queue holds (the producer blocks when it is full).
        name: the thread's name (shows in ``py-spy`` and tracebacks).
        timeout: seconds ``next()`` waits for an item before a FeedfastError (None: forever).
        setup: run first on the thread, before ``produce()``: the loader binds the delivery device
            there (:meth:`~feedfast.loader.devices.DeviceLayer.bind_thread`), so that no CUDA call
            of the thread lands on another device; a failure in it reaches the consumer like any other.
    """

    def __init__(self, produce: Callable[[], Iterator[T]], depth: int, name: str = "feedfast-ahead",
                 timeout: float | None = None, setup: Callable[[], None] | None = None) -> None:
        self._produce = produce
        self._setup = setup
        self._timeout = timeout
        self.stopped = False  # closed by the consumer before the end
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        items = None
        try:
            if self._setup is not None:
                self._setup()
            items = self._produce()
            for item in items:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as exc:  # noqa: BLE001 - every failure crosses to the consumer
            self._put(_Raised(exc))
        finally:
            close = getattr(items, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - a failure while closing after a stop has no consumer
                    if not self._stop.is_set():
                        raise

    def _put(self, item: Any) -> bool:
        """Queue ``item`` unless the consumer stopped; False when stopped."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> "Ahead[T]":
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            item = self._queue.get(timeout=self._timeout)
        except queue.Empty:
            raise FeedfastError(f"no batch within timeout={self._timeout:g} s: the loader's thread "
                                f"{self._thread.name!r} is still working on it (a slow or stalled read?)") from None
        if item is _END:
            self._done = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, _Raised):
            self._done = True
            self._thread.join()
            raise item.exc
        return item  # type: ignore[no-any-return]

    def resize(self, depth: int) -> None:
        """Hold up to ``depth`` finished items from now on (a smaller depth takes effect as items are taken)."""
        with self._queue.mutex:
            self._queue.maxsize = max(1, depth)
            self._queue.not_full.notify_all()

    @property
    def alive(self) -> bool:
        """Whether the producer thread is still running."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the producer, drop what it made, and wait for its thread (it closes its iterator)."""
        self.stopped = self.stopped or not self._done
        self._stop.set()
        self._done = True
        if threading.current_thread() is self._thread:
            return  # closed from its own iterator (a finalizer): the thread ends at its next put
        while self._thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)
