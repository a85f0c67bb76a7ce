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

The index of a shard read from elsewhere (http, s3, gs, the shard cache) is checked as it is
read: each read starts one block early, so it holds the tar header before every member it
reads, and a member that is not where its header says it is (an index whose offsets point
at the next sample, or that belongs to another version of the shard) is an error naming the
shard, the sample and the offset, never a mislabelled sample. The check costs 512 bytes a
read, one key read a sample and about 1 us a member (:func:`.memberheader.first_problem`).
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np

from feedfast.errors import ShardError
from feedfast.shards.tar.memberheader import BLOCK, first_problem
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import Transfer
from feedfast.shards.transport.shardfiles import ShardFiles
from feedfast.shards.transport.transport import Transport, transport_for
from feedfast.sources.lostrows import LostShards, lost_last

MAX_GAP = 256 * 1024
LOCAL_GAP = 16 * 1024  # a local read is a syscall and a copy, not a request: merge only near neighbours
MERGE_BYTES = 16 << 20
"""Neighbouring windows of a shard wanted at once are read in one request of at most this many bytes (more
when one window alone is larger): on loopback moto's S3 server costs about 4 ms of CPU a request whatever
its size, and a request to a real object store costs a round trip and a fee."""
Span = tuple[int, int, int, int]  # (offset, size, row, component)
EMPTY = np.empty(0, dtype=np.uint8)
"""A member of no bytes."""
MISSING = np.empty(0, dtype=np.uint8)
"""No such member (a sample without that component): empty as well, for DALI; a reader that tells the two
apart compares with ``is``."""


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
        requests: window reads at once (:class:`WindowCache`).
        valid: under ``on_error: skip`` (DALI's feed), each step's count of samples (``EpochPlan.valid``): a
            shard that cannot be read mid-epoch loses its rows (:mod:`.lostrows`), each step's batch made
            whole by :meth:`batch` and recorded in :attr:`filled`. None: the read fails.
    """

    def __init__(self, names: tuple[str, ...], kinds: tuple[str, ...], rows: Any, step_rows: Any, *, steps: int,
                 cache: ShardCache | None, transfer: Transfer, workers: int = 2, ahead: int = 4,
                 windows: bool = True, requests: int = 8, valid: Sequence[int] | None = None) -> None:
        self.names, self.kinds = names, kinds
        self.rows = rows
        self.components = rows.index.components
        self.step_rows, self.steps = step_rows, steps
        self.cache, self.transfer = cache, transfer
        self.ahead = ahead
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="feedfast-stream")
        self._pending: dict[int, Future[list[list[np.ndarray]]]] = {}
        self._windows = WindowCache(rows.window if windows else None, self._fetch_samples, requests=requests,
                                    nbytes=self._bytes, shard_of=self._shard_of)
        self._transports: dict[int, Transport] = {}
        self.files = ShardFiles(names)  # local shards stay open: a shuffled epoch reads sample by sample
        self.valid = valid
        self.lost = LostShards(names, rows.shards, self.components) if valid is not None else None
        self.filled: dict[int, Filled] = {}  # steps with rows lost, made whole (under skip)
        self._spare: list[np.ndarray] | None = None  # a sample read earlier: fills a batch all of whose rows are lost
        weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        if self._windows._io is not None:
            weakref.finalize(self, self._windows._io.shutdown, wait=False)
        weakref.finalize(self, self.files.close)

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
        self._windows.close()
        self.files.close()

    def _dali_batch(self, step: int) -> list[Any]:
        """The samples of step ``step`` as one DALI ``TensorListCPU`` per component, made in a reader thread.

        Handed to ``external_source`` whole, a TensorList skips DALI's Python checks of each sample's
        array (its ``_prep_data_for_feed_input``): measured with 256 samples of two components, 9.6 to
        12.6 us a sample of the pipeline thread's time for lists of arrays, 0.7 us for TensorLists made
        beforehand (1.8 us a sample and component to make one, here, ahead of DALI's asking).
        """
        from nvidia.dali.tensors import TensorListCPU

        return [TensorListCPU(arrays) for arrays in self.batch(step)]

    def want(self, rows: list[int]) -> None:
        """Start reading the windows of ``rows`` not read yet (a read-ahead's whole steps: neighbouring windows
        wanted at once become one request), without waiting; nothing to do outside a windowed or block order."""
        if self._windows.active:
            self._windows.want(self.rows.samples(rows).tolist())

    def batch(self, step: int) -> list[list[np.ndarray]]:
        """The samples of step ``step``, read now (in the calling thread). Under skip, a step with rows lost is
        made whole (:func:`~.lostrows.lost_last`): its samples first, its lost rows after them, each a copy of
        one of its samples (of a sample read earlier when none is left), then its padding; see :attr:`filled`."""
        rows = self.step_rows(step)
        if self.lost is None or self.valid is None:
            return self.members(rows)
        columns = self.lost.read(rows, self.members)
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
                columns = self.lost.read([r], self._unwindowed)  # a shard that fails now is lost as well
                if columns[0][0] is not None:
                    self._spare = [column[0] for column in columns]
                    return self._spare
        first = next(iter(self.lost.dead.values()), "")
        raise ShardError(f"under on_error: skip, no shard of this rank's epoch can be read, so nothing is left to "
                         f"fill its batches with ({len(self.lost.dead)} shards lost mid-epoch; the first {first})")

    def members(self, rows: list[int]) -> list[list[np.ndarray]]:
        """Per component, the members of ``rows`` (the rank's row numbers, in that order), read now: from their
        windows under a windowed or block order, else in ranged reads merged where members are near."""
        if self._windows.active:
            samples = self.rows.samples(rows).tolist()
            held = self._windows.rows(samples)
            return [[held[s, c] for s in samples] for c in range(self.components)]
        return self._unwindowed(rows)

    def _unwindowed(self, rows: list[int]) -> list[list[np.ndarray]]:
        """Per component, the members of ``rows``, in ranged reads merged where members are near."""
        got = self._fetch(sorted(set(rows)))
        return [[got[r, c] for r in rows] for c in range(self.components)]

    def _fetch(self, rows: list[int]) -> dict[tuple[int, int], np.ndarray]:
        """The members of ``rows``, by (row, component)."""
        return self._fetch_where(rows, self.rows.take(rows))

    def _bytes(self, samples: list[int]) -> int:
        """The member bytes of ``samples`` (canonical numbers)."""
        sizes = self.rows.index.take(samples).sizes
        return int(sizes[sizes > 0].sum())

    def _shard_of(self, sample: int) -> int:
        """The shard of sample ``sample`` (a canonical number), from the index's shard starts (no read)."""
        return int(self.rows.index.shard_of(np.asarray([sample], dtype=np.int64))[0])

    def _fetch_samples(self, samples: list[int]) -> dict[tuple[int, int], np.ndarray]:
        """The members of ``samples`` (canonical numbers: a window's), by (sample, component)."""
        return self._fetch_where(samples, self.rows.index.take(samples))

    def _fetch_where(self, rows: list[int], where: Any) -> dict[tuple[int, int], np.ndarray]:
        """The members ``where`` locates, by (``rows``' item, component)."""
        got: dict[tuple[int, int], np.ndarray] = {}
        spans: dict[int, list[Span]] = {}
        for r, shard, offsets, sizes in zip(rows, where.shard.tolist(), where.offsets.tolist(), where.sizes.tolist()):
            for c, (offset, size) in enumerate(zip(offsets, sizes)):
                if size <= 0:
                    got[r, c] = EMPTY if size == 0 else MISSING
                else:
                    spans.setdefault(shard, []).append((offset, size, r, c))
        keys = self._keys(rows, where, spans)
        for shard, items in spans.items():
            checked = self.kinds[shard] != "file"
            for run in runs(sorted(items), MAX_GAP if checked else LOCAL_GAP):
                start, end = run[0][0], max(o + s for o, s, _, _ in run)
                base = start - BLOCK if checked else start  # a checked read takes its first member's header too
                if base < 0:
                    self._mismatch(shard, run[0], keys, "it leaves no room for its header")
                chunk = self._read(shard, base, end - base)
                if checked:
                    self._check(shard, run, chunk, base, keys)
                for off, size, r, c in run:
                    got[r, c] = np.frombuffer(chunk, dtype=np.uint8, count=size, offset=off - base)
        return got

    def _keys(self, rows: list[int], where: Any, spans: dict[int, list[Span]]) -> dict[int, str]:
        """The sample key of each row, when any of the rows is in a shard checked as it is read."""
        if all(self.kinds[shard] == "file" for shard in spans):
            return {}
        return dict(zip(rows, self.rows.index.batch_keys(where)))

    def _check(self, shard: int, run: list[Span], chunk: bytes, base: int, keys: dict[int, str]) -> None:
        """The index of a remote or cached shard checked against the tar as it is read: each member read sits
        right after its own header (:mod:`.memberheader`), which this read holds (its start is one block early,
        and the headers of the other members lie between them)."""
        blocks = [chunk[off - BLOCK - base: off - base] for off, _, _, _ in run]
        found = first_problem(blocks, [keys[r] for _, _, r, _ in run], [size for _, size, _, _ in run])
        if found is not None:
            self._mismatch(shard, run[found[0]], keys, found[1])

    def _mismatch(self, shard: int, span: Span, keys: dict[int, str], why: str) -> None:
        offset, _, row, _ = span
        raise ShardError(f"the index of shard {self.names[shard]!r} does not match the tar: sample {keys[row]!r} "
                         f"has a member at offset {offset}, but {why}; the index (a sidecar .idx beside the shard, "
                         "or one cached for it) is stale or wrong: rebuild it with `feedfast shards index`, or delete it")

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        if self.kinds[shard] == "file":
            return self.files.read(shard, offset, size)  # kept open: a shuffled epoch reads sample by sample
        transport = self._transports.get(shard)
        if transport is None:
            transport = self._transports[shard] = self._transport(shard)
        return transport.read_range(self.names[shard], offset, size)

    def _transport(self, shard: int) -> Transport:
        """How a non-local shard is read: the shard cache for ``cache`` shards, else its URL's transport."""
        if self.kinds[shard] != "cache":
            return transport_for(self.names[shard], self.transfer)
        if self.cache is None:
            raise ShardError(f"shard {self.names[shard]!r} is read from the shard cache, but no cache was configured")
        return self.cache


class Filled(NamedTuple):
    """A step of DALI's feed with rows lost (under skip), made whole: what its batch's rows are."""

    order: list[int]  # the step's rows (positions) in the order fed: its samples, its lost rows, its padding
    valid: int  # its samples left
    lost: tuple[int, ...]  # the rows lost among its samples (the rank's row numbers)


class Windows(Protocol):
    """The windows of an epoch's order: what :class:`WindowCache` asks of it (:class:`~feedfast.order.epoch.BlockOrder`,
    :class:`~feedfast.order.rows.WindowShuffle`). An order whose windows are read spread over rows also has
    ``place(window) -> int`` (where in the rank's order, -1: not this rank's) and ``horizon`` (over how many
    rows): then :class:`WindowCache` widens reads to the neighbouring windows read within that horizon."""

    def window_of(self, samples: np.ndarray) -> np.ndarray: ...

    def members(self, window: int) -> np.ndarray: ...


class WindowCache:
    """Whole windows of consecutive samples, each read once in a large range and kept while its samples are served.

    A windowed shuffle (:class:`feedfast.order.rows.WindowShuffle`) or a block shuffle
    (:class:`feedfast.order.epoch.BlockOrder`) takes each step's samples from windows of
    consecutive samples of one shard; reading a window at once turns ``window`` small
    requests into one. The windows a step lacks are read concurrently, ``requests`` at a
    time (a block shuffle's first step needs hundreds; on a remote store each one costs a
    round trip); given ``nbytes`` (the member bytes of samples), windows wanted at once that
    follow each other in a shard are read together, up to :data:`MERGE_BYTES` a request
    (:meth:`want` lets a read-ahead ask for whole steps before they are read); and where the
    order says where its windows are read (the block shuffle's ``place``), a read is widened,
    within the same bytes, to the neighbouring windows of its shard that this rank reads within
    ``horizon`` rows of it, so a shard's windows wanted one step apart are one request, not
    one each (:meth:`_widen`). A window is
    dropped as soon as each of its samples this rank reads has been served once, so a block
    shuffle holds about ``block`` samples and nothing is kept per sample of the epoch (the
    bytes of one request stay until its last window is dropped). Thread-safe: one reader per
    window, others wait for it. A window asked for after it was dropped (a step read again, a
    padded repeat) is read again.
    """

    def __init__(self, windows: Windows | None, fetch: Any, *, requests: int = 8,
                 nbytes: Callable[[list[int]], int] | None = None, shard_of: Callable[[int], int] | None = None) -> None:
        self.active = windows is not None
        self._windows, self._fetch, self._nbytes, self._shard_of = windows, fetch, nbytes, shard_of
        self._place = getattr(windows, "place", None) if nbytes is not None and shard_of is not None else None
        self._cache: dict[int, Future[dict[tuple[int, int], np.ndarray]]] = {}
        self._served: dict[int, set[int]] = {}
        self._sizes: dict[int, int] = {}
        self._done = bytearray()  # 1 at each window all of whose samples were served: never widened into again
        self._lock = threading.Lock()
        self._io = ThreadPoolExecutor(max_workers=requests, thread_name_prefix="feedfast-window") if self.active else None

    def want(self, samples: list[int]) -> None:
        """Start reading the windows of ``samples`` that are not held or being read, without waiting."""
        assert self._windows is not None
        _, missing = self._claim(self._windows.window_of(np.asarray(samples, dtype=np.int64)).tolist())
        for group in self._groups(missing):
            self._start(group)

    def rows(self, samples: list[int]) -> "_WindowRows":
        """The arrays of ``samples`` by (sample, component), from their windows (read first if need be)."""
        assert self._windows is not None
        of = self._windows.window_of(np.asarray(samples, dtype=np.int64)).tolist()
        wanted, missing = self._claim(of)
        groups = self._groups(missing)
        if len(groups) == 1 or self._io is None:
            for group in groups:
                self._fill(group)
        else:
            for group in groups:
                self._start(group)
        got = _WindowRows({w: fut.result() for w, fut in wanted.items()}, dict(zip(samples, of)))
        self._count(samples, of)
        return got

    def _claim(self, of: list[int]) -> tuple[dict[int, Future[dict[tuple[int, int], np.ndarray]]],
                                             list[tuple[int, Future[dict[tuple[int, int], np.ndarray]]]]]:
        """The future of each of the windows ``of``, and those (sorted) that no one reads yet: this caller reads them."""
        wanted: dict[int, Future[dict[tuple[int, int], np.ndarray]]] = {}
        missing = []
        with self._lock:
            for w in sorted(set(of)):
                fut = self._cache.get(w)
                if fut is None:
                    fut = self._cache[w] = Future()
                    missing.append((w, fut))
                wanted[w] = fut
        return wanted, missing

    def _groups(self, missing: list[tuple[int, Future[Any]]]) -> list[list[tuple[int, Future[Any], list[int]]]]:
        """``missing`` (sorted windows) with their members, in reads: runs of windows that follow each other in a
        shard, up to :data:`MERGE_BYTES` a read, when ``nbytes`` is known (a shard's bytes only: a run across
        two shards is two requests), each widened where the order allows (:meth:`_widen`); else one window a read."""
        assert self._windows is not None
        groups: list[list[tuple[int, Future[Any], list[int]]]] = []
        sizes: list[int] = []
        for w, fut in missing:
            members = self._windows.members(w).tolist()
            size = self._nbytes(members) if self._nbytes is not None else 0
            last = groups[-1][-1] if groups else None
            if (self._nbytes is not None and last is not None and last[0] + 1 == w and last[2] and members
                    and last[2][-1] + 1 == members[0] and sizes[-1] + size <= MERGE_BYTES
                    and (self._shard_of is None or self._shard_of(members[0]) == self._shard_of(last[2][0]))):
                groups[-1].append((w, fut, members))
                sizes[-1] += size
            else:
                groups.append([(w, fut, members)])
                sizes.append(size)
        if self._place is not None:
            later = {group[0][0]: (i, size) for i, (group, size) in enumerate(zip(groups, sizes))}
            for group, size in zip(groups, sizes):
                if group:  # not merged into an earlier one
                    self._widen(group, size, groups, later)
            groups = [group for group in groups if group]
        return groups

    def _widen(self, group: list[tuple[int, Future[Any], list[int]]], size: int,
               groups: list[list[tuple[int, Future[Any], list[int]]]], later: dict[int, tuple[int, int]]) -> None:
        """Add to ``group`` (in place) the windows before and after it in its shard that no one reads yet and
        that this rank reads within ``horizon`` rows of the group's first, while the read stays within
        :data:`MERGE_BYTES`; they are claimed (held until served, as any window read). A window reached that
        starts a later group of ``groups`` (``later``: its first window -> its number and bytes; the gap between
        the two widened away) takes that group in, emptied there, and the widening goes on past it."""
        assert self._windows is not None and self._place is not None and self._nbytes is not None
        assert self._shard_of is not None
        if not group[0][2]:
            return
        at, horizon = self._place(group[0][0]), int(getattr(self._windows, "horizon", 0))
        shard = self._shard_of(group[0][2][0])
        for step in (1, -1):
            while True:
                edge = group[-1] if step > 0 else group[0]
                w = edge[0] + step
                if w < 0:
                    break
                members = self._windows.members(w).tolist()
                if not members or not edge[2] or (edge[2][-1] + 1 != members[0] if step > 0
                                                  else members[-1] + 1 != edge[2][0]):
                    break  # not this rank's, or not next to it
                if step > 0 and w in later and groups[later[w][0]]:  # the next group of this call: one read
                    i, more = later[w]
                    if size + more > MERGE_BYTES or self._shard_of(members[0]) != shard:
                        break
                    group.extend(groups[i])
                    groups[i] = []
                    size += more
                    continue
                place = self._place(w)
                extra = self._nbytes(members)
                if place < 0 or abs(place - at) > horizon or size + extra > MERGE_BYTES \
                        or self._shard_of(members[0]) != shard:
                    break
                with self._lock:
                    if w in self._cache or (w < len(self._done) and self._done[w]):
                        break  # being read or held, or served already
                    fut: Future[dict[tuple[int, int], np.ndarray]] = Future()
                    self._cache[w] = fut
                if step > 0:
                    group.append((w, fut, members))
                else:
                    group.insert(0, (w, fut, members))
                size += extra

    def _start(self, group: list[tuple[int, Future[Any], list[int]]]) -> None:
        assert self._io is not None
        try:
            self._io.submit(self._fill, group)
        except RuntimeError:  # closed meanwhile: read it here, so no waiter is left hanging
            self._fill(group)

    def _count(self, samples: list[int], of: list[int]) -> None:
        """Count ``samples`` served; drop the windows each of whose samples has been."""
        with self._lock:
            for sample, w in zip(samples, of):
                served = self._served.setdefault(w, set())
                served.add(sample)
                if len(served) >= self._sizes.get(w, -1) and w in self._cache:
                    del self._cache[w], self._served[w], self._sizes[w]
                    if w >= len(self._done):
                        self._done.extend(bytes(w + 1 - len(self._done)))
                    self._done[w] = 1

    def held(self) -> int:
        """How many windows are in memory (read or being read)."""
        return len(self._cache)

    def close(self) -> None:
        """Stop the window readers (reads already asked for finish: a step may wait on them) and drop the windows."""
        if self._io is not None:
            self._io.shutdown(wait=True)
        with self._lock:
            self._cache.clear()
            self._served.clear()
            self._sizes.clear()
            self._done = bytearray()

    def _fill(self, group: list[tuple[int, Future[Any], list[int]]]) -> None:
        """Read the windows of ``group`` in one fetch: each window's future gets the fetch's arrays."""
        try:
            with self._lock:
                for w, _, members in group:
                    self._sizes[w] = len(members)
            got = self._fetch([s for _, _, members in group for s in members])
        except BaseException as exc:
            with self._lock:
                for w, fut, _ in group:
                    if self._cache.get(w) is fut:
                        del self._cache[w]  # read again by the next step that asks
            for _, fut, _ in group:
                fut.set_exception(exc)
            return
        for _, fut, _ in group:
            fut.set_result(got)


class _WindowRows:
    """(sample, component) -> array, looked up in the sample's window: a step touching hundreds of windows
    (a block shuffle) copies none of their other samples."""

    def __init__(self, windows: dict[int, dict[tuple[int, int], np.ndarray]], window_of: dict[int, int]) -> None:
        self._windows, self._window_of = windows, window_of

    def __getitem__(self, key: tuple[int, int]) -> np.ndarray:
        return self._windows[self._window_of[key[0]]][key]


def runs(items: list[Span], gap: int = MAX_GAP) -> list[list[Span]]:
    """Split spans sorted by offset into runs read at once (gaps of at most ``gap`` bytes)."""
    out: list[list[Span]] = []
    end = 0
    for item in items:
        if out and item[0] - end <= gap:
            out[-1].append(item)
            end = max(end, item[0] + item[1])
        else:
            out.append([item])
            end = item[0] + item[1]
    return out
