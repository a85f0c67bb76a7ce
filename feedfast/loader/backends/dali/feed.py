"""The batch callable behind the stream transport: reads a step's samples, a few steps ahead.

DALI's ``external_source`` calls it with a ``BatchInfo`` (or an iteration number) and gets
one list of ``batch_size`` uint8 arrays per component. Reads are I/O (HTTP ranges, or
``pread`` of local and cached shards), so they run in a small thread pool of this
process, ``ahead`` steps ahead of what DALI asked for, instead of in DALI's
``parallel=True`` worker processes: two pipelines with parallel external sources alive
at once in one process (the loader builds the next epoch's while the current one drains)
were seen to hand the decoder corrupted bytes under DALI 2.4, and threads need no
``fork``/``spawn`` choice, no pickling and no ``__main__`` guard.

The result for a step depends only on the step, so calls may come in any order, and a
pipeline restored from a checkpoint simply starts asking at the saved step.

The members are read by :class:`~feedfast.sources.memberread.MemberReader`.
"""

from __future__ import annotations

import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Sequence

import numpy as np

from feedfast.errors import ShardError
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import Transfer
from feedfast.sources.lostrows import LostShards, lost_last
from feedfast.sources.memberread import MemberReader


class BatchFeeder:
    """``BatchInfo`` -> per component, the step's ``batch_size`` samples as uint8 arrays.

    Args:
        names: shard names (paths or URLs), by shard number.
        kinds: how each shard is read: ``file``, ``http`` or ``cache``.
        rows: the rank's samples in reading order (:class:`feedfast.order.rows.Rows`).
        step_rows: maps a step to its row numbers (padding included).
        steps: steps in the epoch; later steps raise ``StopIteration``.
        cache, transfer: the shard cache and the remote settings.
        workers, ahead: reader threads, and how many steps past the asked one they fetch.
        windows: read a windowed or block order's samples a whole window at a time, held until served
            (False: only the samples asked for, merged where near: a reader that sees only some of the
            steps, such as one DataLoader worker process of several, would hold windows it never finishes).
        requests: window reads at once (:class:`~feedfast.sources.windows.WindowCache`).
        valid: under ``on_error: skip`` (DALI's feed), each step's count of samples (``EpochPlan.valid``): a
            shard that cannot be read mid-epoch loses its rows (:mod:`.lostrows`), each step's batch made
            whole by :meth:`batch` and recorded in :attr:`filled`. None: the read fails.
    """

    def __init__(self, names: tuple[str, ...], kinds: tuple[str, ...], rows: Any, step_rows: Any, *, steps: int,
                 cache: ShardCache | None, transfer: Transfer, workers: int = 2, ahead: int = 4,
                 windows: bool = True, requests: int = 8, valid: Sequence[int] | None = None) -> None:
        self.names = names
        self.rows = rows
        self.components = rows.index.components
        self.step_rows, self.steps = step_rows, steps
        self.ahead = ahead
        self.reader = MemberReader(names, kinds, rows, cache=cache, transfer=transfer, windows=windows,
                                   requests=requests)
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="feedfast-stream")
        self._pending: dict[int, Future[list[list[np.ndarray]]]] = {}
        self.valid = valid
        self.lost = LostShards(names, rows.shards, self.components) if valid is not None else None
        self.filled: dict[int, Filled] = {}  # steps with rows lost, made whole (under skip)
        self._spare: list[np.ndarray] | None = None  # a sample read earlier: fills a batch all of whose rows are lost
        weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)

    def __call__(self, info: Any) -> list[list[np.ndarray]]:
        step = int(getattr(info, "iteration", info))
        if step >= self.steps:
            raise StopIteration
        for s in range(step, min(step + self.ahead + 1, self.steps)):
            if s not in self._pending:
                self._pending[s] = self._pool.submit(self._dali_batch, s)
        for stale in [s for s in self._pending if s < step]:
            self._pending.pop(stale).cancel()
        return self._pending.pop(step).result()

    def close(self) -> None:
        """Stop the reader threads and close the shards; pending reads are dropped."""
        self._pending.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.reader.close()

    def _dali_batch(self, step: int) -> list[Any]:
        """The samples of step ``step`` as one DALI ``TensorListCPU`` per component, made in a reader thread.

        Handed to ``external_source`` whole, a TensorList skips DALI's Python checks of each sample's
        array (its ``_prep_data_for_feed_input``): measured with 256 samples of two components, 9.6 to
        12.6 us a sample of the pipeline thread's time for lists of arrays, 0.7 us for TensorLists made
        beforehand (1.8 us a sample and component to make one, here, ahead of DALI's asking).
        """
        from nvidia.dali.tensors import TensorListCPU

        return [TensorListCPU(arrays) for arrays in self.batch(step)]

    def batch(self, step: int) -> list[list[np.ndarray]]:
        """The samples of step ``step``, read now (in the calling thread). Under skip, a step with rows lost is
        made whole (:func:`~.lostrows.lost_last`): its samples first, its lost rows after them, each a copy of
        one of its samples (of a sample read earlier when none is left), then its padding; see :attr:`filled`."""
        rows = self.step_rows(step)
        if self.lost is None or self.valid is None:
            return self.reader.members(rows)
        columns = self.lost.read(rows, self.reader.members)
        gone = {i for i in range(len(rows)) if columns[0][i] is None}
        if not gone:
            self._spare = self._spare or [column[0] for column in columns]
            return columns
        valid = self.valid[step]
        order, fill, kept = lost_last(len(rows), valid, gone)
        spare = [column[fill] for column in columns] if fill is not None else self._any_sample()
        self.filled[step] = Filled(order, kept, tuple(rows[i] for i in sorted(gone) if i < valid))
        return [[spare[c] if i in gone else column[i] for i in order] for c, column in enumerate(columns)]

    def _any_sample(self) -> list[np.ndarray]:
        """One sample of the epoch, read apart from the windows: the first row of a shard that can be read (or
        one read before), to fill a batch all of whose rows are lost (DALI decodes every row).

        Raises:
            ShardError: no shard of the rank's epoch can be read.
        """
        assert self.lost is not None
        if self._spare is not None:
            return self._spare
        for lo in range(0, len(self.rows), 1024):
            for r in self.lost.live(list(range(lo, min(lo + 1024, len(self.rows))))):
                columns = self.lost.read([r], self.reader.unwindowed)  # a shard that fails now is lost as well
                if columns[0][0] is not None:
                    self._spare = [column[0] for column in columns]
                    return self._spare
        first = next(iter(self.lost.dead.values()), "")
        raise ShardError(f"under on_error: skip, no shard of this rank's epoch can be read, so nothing is left to "
                         f"fill its batches with ({len(self.lost.dead)} shards lost mid-epoch; the first {first})")

    def want(self, rows: list[int]) -> None:
        """Start reading the windows of ``rows`` ahead (:meth:`MemberReader.want`)."""
        self.reader.want(rows)


class Filled(NamedTuple):
    """A step of DALI's feed with rows lost (under skip), made whole: what its batch's rows are."""

    order: list[int]  # the step's rows (positions) in the order fed: its samples, its lost rows, its padding
    valid: int  # its samples left
    lost: tuple[int, ...]  # the rows lost among its samples (the rank's row numbers)
