"""The batch callable behind DALI's ``external_source``: a step's members, read a few steps ahead.

DALI's ``external_source`` calls it with a ``BatchInfo`` (or an iteration number) and gets one
TensorList of ``batch_size`` uint8 samples per component. Reads are I/O, so they run on a small
thread pool of this process, ``ahead`` steps ahead of what DALI asked for, in step order, instead
of in DALI's ``parallel=True`` worker processes: two pipelines with parallel external sources alive
at once in one process were seen to hand the decoder corrupted bytes under DALI 2.4, and threads
need no ``fork``/``spawn`` choice, no pickling and no ``__main__`` guard.

Local shards and images read in place (the common case: a shuffled epoch reads its global order
sample by sample) take the packed path, with no Python per sample where it can be avoided. Local
shards are mapped read-only, once each for the feed's life, and a step's members are handed to
DALI as views of the maps (``Members.mapped``), as DALI's own reader hands its decoder a shard's
bytes: no read and no copy (``external_source(no_copy=True)``). A folder's files are read through
the dataset's reader in one C call a component (``Members.packed``: ``_plan.read_files`` by path,
end to end, the GIL released) into a buffer of a reused ring, handed to DALI as one TensorList
sharing it; the ring holds more steps than DALI and the read-ahead can hold at once, so a buffer
is written again only after DALI is done with it. Remote and cached shards, and epochs under ``on_error:
skip``, are read by :class:`~feedfast.sources.memberread.MemberReader` (which checks each remote
member against its tar header) and copied into TensorLists. After the components come the step's
draws (each sample's crop window and flips, :mod:`.draws`), where the plan's DALI graph takes them.

The result for a step depends only on the step, so calls may come in any order, and a pipeline
restored from a checkpoint simply starts asking at the saved step.
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, NamedTuple, Sequence

import numpy as np

from feedfast.errors import ShardError
from feedfast.loader.backends.dali.draws import StepDraws
from feedfast.loader.backends.dali.ring import Ring
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import Transfer
from feedfast.shards.transport.shardfiles import ShardFiles
from feedfast.sources.lostrows import LostShards, lost_last
from feedfast.sources.memberread import MemberReader
from feedfast.sources.members import Members, ShardMembers, StepBytes

try:
    from feedfast import _plan
except ImportError:  # not built at install: the member reader reads (Python per sample)
    _plan = None

PACKED_AHEAD = 4
"""Steps read ahead on the packed path: a step is one call a component (about 5 ms for 256 members of 55 KB),
so a few steps cover DALI's asking; more would only hold ring buffers."""
HOST_KEPT = 64
"""Steps a host component's members are kept after DALI asked for a later step (an epoch left mid-way)."""
DALI_HOLDS = 4
"""Steps DALI may hold after asking for them (its prefetch queue and the iteration it runs): a ring slot
is written again only after this many more steps, plus the read-ahead, were asked for."""


class BatchFeeder:
    """``BatchInfo`` -> per component, the step's ``batch_size`` samples as a DALI TensorList.

    Args:
        names: shard names (paths or URLs), by shard number.
        kinds: how each shard is read: ``file``, ``http`` or ``cache``.
        rows: the rank's samples in reading order (:class:`feedfast.order.rows.Rows`).
        step_rows: maps a step to its row numbers (padding included).
        steps: steps in the epoch; later steps raise ``StopIteration``.
        cache, transfer: the shard cache and the remote settings.
        workers, ahead: reader threads (at most two on the packed path, where each reads a whole step per call),
            and how many steps past the asked one they read.
        windows: read a windowed or block order's samples a whole window at a time, held until served.
        requests: window reads at once (:class:`~feedfast.sources.windows.WindowCache`).
        valid: under ``on_error: skip`` (DALI's feed), each step's count of samples (``EpochPlan.valid``): a
            shard that cannot be read mid-epoch loses its rows (:mod:`.lostrows`), each step's batch made
            whole by :meth:`batch` and recorded in :attr:`filled`. None: the read fails.
        holds: steps DALI may hold after asking for them (the ring's margin, :data:`DALI_HOLDS`).
        dali: the components DALI takes, in that order (None: all); the others (read by host ops alone, such as
            a ``.cls`` label) are kept for :meth:`host`, never made into TensorLists.
        ring, ring_base: a ring shared with the feeds of other epochs of one pipeline (step ``s`` takes slot
            ``ring_base + s``, numbered on from the epoch before), else one of its own.
        draws: the epoch's draws DALI is fed after the components (each sample's crop window and flips:
            :mod:`.draws`), None: none.
        members: the dataset's reader of a step's members end to end (``dataset.members``: a folder's read in
            place), which the packed path reads through; None: local shards' at their offsets.
    """

    def __init__(self, names: tuple[str, ...], kinds: tuple[str, ...], rows: Any, step_rows: Any, *, steps: int,
                 cache: ShardCache | None, transfer: Transfer, workers: int = 2, ahead: int = 4,
                 windows: bool = True, requests: int = 8, valid: Sequence[int] | None = None,
                 holds: int = DALI_HOLDS, dali: Sequence[int] | None = None, ring: Ring | None = None,
                 ring_base: int = 0, draws: StepDraws | None = None, members: Members | None = None) -> None:
        self.names = names
        self.draws = draws
        local = all(kind == "file" for kind in kinds)
        self.members = members if members is not None else ShardMembers(names) if local else None
        self.rows = rows
        self.components = rows.index.components
        self.dali = list(range(self.components)) if dali is None else list(dali)
        self._host: dict[int, dict[int, Any]] = {}  # step -> component -> its members, for host ops
        self.step_rows, self.steps = step_rows, steps
        files = self.members.files if isinstance(self.members, ShardMembers) else ShardFiles(names)
        self.reader = MemberReader(names, kinds, rows, cache=cache, transfer=transfer, files=files, windows=windows,
                                   requests=requests)
        # local shards read sample by sample: a windowed order's windows and skip's lost rows take the reader
        self.packed = (_plan is not None and self.members is not None and local and valid is None
                       and not (windows and rows.window is not None))
        self.ahead = min(ahead, PACKED_AHEAD) if self.packed else ahead
        self.ring = (ring or Ring(self.components, self.ahead + holds + 2)) if self.packed else None
        """The ring the packed path reads DALI's components into (None off it), shared by the next epoch's feed."""
        self._ring_base = ring_base
        threads = min(workers, 2) if self.packed else workers  # a packed read is a step per call, the GIL released
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="feedfast-feed")
        self._pending: dict[int, Future[list[Any]]] = {}
        self._lock = threading.Lock()
        self.valid = valid
        self.lost = LostShards(names, rows.shards, self.components) if valid is not None else None
        self.filled: dict[int, Filled] = {}  # steps with rows lost, made whole (under skip)
        self._spare: list[np.ndarray] | None = None  # a sample read earlier: fills a batch all of whose rows are lost
        weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)

    def __call__(self, info: Any) -> list[Any]:
        step = int(getattr(info, "iteration", info))
        if step >= self.steps:
            raise StopIteration
        with self._lock:
            for s in range(step, min(step + self.ahead + 1, self.steps)):
                self._submit(s)
            for stale in [s for s in self._pending if s < step]:
                self._pending.pop(stale).cancel()
            for stale in [s for s in self._host if s < step - HOST_KEPT]:
                del self._host[stale]
            pending = self._pending.pop(step)
        return pending.result()

    def prefetch(self, step: int) -> None:
        """Start reading step ``step`` now, before DALI asks for it (the first steps of the epoch queued after the
        one DALI is finishing: the boundary then waits on no read). The caller keeps the ring's rule: ``step`` is
        at most the read-ahead past the last step fed, counted across the epochs sharing the ring."""
        if step < self.steps:
            with self._lock:
                self._submit(step)

    def _submit(self, step: int) -> None:
        if step not in self._pending:
            self._pending[step] = self._pool.submit(self._dali_batch, step)

    def close(self) -> None:
        """Stop the reader threads and close the shards; pending reads are dropped."""
        with self._lock:
            self._pending.clear()
            self._host.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.reader.close()
        if self.members is not None:
            self.members.close()

    def _dali_batch(self, step: int) -> list[Any]:
        """The samples of step ``step`` as one DALI ``TensorListCPU`` per component, made in a reader thread:
        on the packed path sharing a ring buffer (no copy), else copied from the member reader's arrays; then
        the step's draws (:attr:`draws`)."""
        from nvidia.dali.tensors import TensorCPU, TensorListCPU

        where = self.rows.take(self.step_rows(step)) if self.ring is not None or self.draws is not None else None
        parts: list[Any] = self._packed(step, where) if self.ring is not None else self.batch(step)
        host = {c: parts[c] for c in range(self.components) if c not in self.dali}
        if host:
            with self._lock:
                self._host[step] = host
        if self.ring is not None:  # TensorCPU shares each view's memory; the list then shares them (measured:
            # 1.4 us a sample, where a list of arrays takes 1.6 and a contiguous TensorList copies, 31 us at 55 KB)
            lists = [TensorListCPU([TensorCPU(v) for v in _buffers(parts[c])], contiguous=False) for c in self.dali]
        else:
            lists = [TensorListCPU(parts[c]) for c in self.dali]
        return lists + self._draws(step, parts, where)

    def _packed(self, step: int, where: Any) -> list[Any]:
        """Step ``step``'s members per component on the packed path: a component DALI takes as views of its shards
        mapped (``Members.mapped``: no read, no copy; measured on 2 cores, the copy out of the page cache was most
        of what kept this loader under DALI's own reader), else read into the ring; a host component read into a
        buffer of its own (:meth:`step_bytes`)."""
        assert self.members is not None
        mapped = {c: self.members.mapped(where, c) for c in self.dali}
        read = [c for c in range(self.components) if mapped.get(c) is None]
        parts = dict(zip(read, self.step_bytes(step, self.ring, read, where=where))) if read else {}
        return [parts[c] if mapped.get(c) is None else mapped[c] for c in range(self.components)]

    def _draws(self, step: int, parts: list[Any], where: Any) -> list[np.ndarray]:
        """Step ``step``'s draws from its members (``parts``, as read; ``where``: its rows), none without
        :attr:`draws`. A step made whole under skip is fed in :attr:`filled`'s order."""
        if self.draws is None:
            return []
        ids = where.draw_ids
        filled = self.filled.get(step)
        if filled is not None:
            ids = ids[filled.order]
        return self.draws.arrays(parts[self.draws.fed.component], ids,
                                 lambda i: (self.names[int(where.shard[i])], self.rows.index.batch_keys(where)[i]))

    def filler(self, step: int) -> list[Any]:
        """Step ``step`` as :meth:`__call__` feeds it, copied out of the ring (a batch DALI runs and feedfast
        drops: the ring's slot moves on)."""
        from nvidia.dali.tensors import TensorListCPU

        columns = self.batch(step)
        where = self.rows.take(self.step_rows(step))
        return [TensorListCPU([a.copy() for a in columns[c]]) for c in self.dali] + self._draws(step, columns, where)

    def host(self, step: int, component: int) -> Any:
        """Step ``step``'s members of ``component`` for host ops: a :class:`StepBytes` on the packed path, else a
        list of arrays; those read for DALI's call, taken once, else read now."""
        with self._lock:
            kept = self._host.get(step)
            part = kept.pop(component, None) if kept is not None else None
            if kept is not None and not kept:
                del self._host[step]
        if part is not None:
            return part
        return self.step_bytes(step, components=[component])[0] if self.packed else self.batch(step)[component]

    def want(self, rows: list[int]) -> None:
        """Start reading the windows of ``rows`` ahead (:meth:`MemberReader.want`)."""
        self.reader.want(rows)

    def step_bytes(self, step: int, ring: Ring | None = None, components: Sequence[int] | None = None, *,
                   where: Any = None) -> list[StepBytes]:
        """Per component, step ``step``'s members end to end in one buffer (for a component DALI takes, a slot of
        ``ring``; else a new one), each component's read one call with the GIL released (local shards; see
        :attr:`packed`). ``components``: only those, in that order (None: all); ``where``: the step's rows
        (``rows.take``), when the caller has them.

        Raises:
            ShardError: a read failed or came short; names the shard and the sample.
        """
        if where is None:
            where = self.rows.take(self.step_rows(step))
        assert self.members is not None  # the packed path reads through the dataset's members
        out: list[StepBytes] = []
        for c in range(self.components) if components is None else components:
            buffer = (partial(ring.take, c, self._ring_base + step) if ring is not None and c in self.dali
                      else partial(np.empty, dtype=np.uint8))
            part, failed = self.members.packed(where, c, buffer)
            if failed >= 0:
                self._read_failed(where, failed)
            out.append(part)
        return out

    def _read_failed(self, where: Any, i: int) -> None:
        """Raise the error of row ``i``'s read, read again on its own (which names what went wrong)."""
        shard, key = self.names[int(where.shard[i])], self.rows.index.batch_keys(where)[i]
        assert self.members is not None
        try:
            self.members.sample(where, i)
        except ShardError as exc:
            raise ShardError(f"cannot read sample {key!r} of shard {shard!r}: {exc}") from exc
        raise ShardError(f"cannot read sample {key!r} of shard {shard!r}: the read came short, then was whole")

    def batch(self, step: int) -> list[list[np.ndarray]]:
        """The samples of step ``step``, read now (in the calling thread). Under skip, a step with rows lost is
        made whole (:func:`~.lostrows.lost_last`): its samples first, its lost rows after them, each a copy of
        one of its samples (of a sample read earlier when none is left), then its padding; see :attr:`filled`."""
        if self.packed:
            return [part.views() for part in self.step_bytes(step)]
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


def _buffers(part: StepBytes | list[Any]) -> list[Any]:
    """A component's members as buffers DALI's ``TensorCPU`` shares: a packed read's views, or mapped views."""
    return part.buffers() if isinstance(part, StepBytes) else part


class Filled(NamedTuple):
    """A step of DALI's feed with rows lost (under skip), made whole: what its batch's rows are."""

    order: list[int]  # the step's rows (positions) in the order fed: its samples, its lost rows, its padding
    valid: int  # its samples left
    lost: tuple[int, ...]  # the rows lost among its samples (the rank's row numbers)
