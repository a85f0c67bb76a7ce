"""The iteration forms of a meter: the wrapping generator and the ``with`` wait scope."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Marks(Protocol):
    """The step marks a form drives (StallMeter's explicit API)."""

    def wait_begin(self) -> None:
        """The loop asks for a batch."""

    def wait_end(self, batch: Any = None, *, batch_size: int | None = None) -> None:
        """The batch is in hand."""

    def wait_cancel(self) -> None:
        """The wait ended without a batch."""

    def step_end(self) -> None:
        """The step's work is done."""

    @property
    def wait_count(self) -> int:
        """How many waits have begun; tells a form whether a newer wait took over."""


def metered(marks: Marks, iterable: Iterable[T]) -> Iterator[T]:
    """Yield ``iterable``'s batches between wait marks.

    ``iter(iterable)`` counts in the first wait (a DataLoader starts its workers there).
    The wait that ends in StopIteration (or a loader error) is dropped. Leaving the loop
    early (``break``) closes the last step when the generator is closed, which CPython
    does as soon as the loop lets go of it; a generator closed after another loop has
    started measuring leaves that loop's wait and step alone.
    """
    marks.wait_begin()
    mine, waiting = marks.wait_count, True
    try:
        iterator = iter(iterable)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            marks.wait_end(batch)
            waiting = False
            yield batch
            marks.wait_begin()
            mine, waiting = marks.wait_count, True
    finally:
        if marks.wait_count == mine:
            if waiting:
                marks.wait_cancel()
            else:
                marks.step_end()


def fetch(marks: Marks, iterator: Iterator[T]) -> T:
    """``next(iterator)`` between wait marks; an exception (StopIteration too) drops the wait."""
    marks.wait_begin()
    try:
        batch = next(iterator)
    except BaseException:
        marks.wait_cancel()
        raise
    marks.wait_end(batch)
    return batch


class WaitScope:
    """What ``with meter.wait() as w`` gives: set ``w.batch`` to count its samples.

    Leaving the block normally ends the wait; leaving it by an exception (StopIteration
    included) drops the wait and lets the exception through.
    """

    __slots__ = ("_batch_size", "_marks", "batch")

    def __init__(self, marks: Marks, batch_size: int | None) -> None:
        self._marks = marks
        self._batch_size = batch_size
        self.batch: Any = None

    def __enter__(self) -> WaitScope:
        self._marks.wait_begin()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self._marks.wait_end(self.batch, batch_size=self._batch_size)
        else:
            self._marks.wait_cancel()
