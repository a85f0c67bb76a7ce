"""Whole windows of consecutive samples read at once and held while their samples are served.

The read-ahead of a windowed or block order (:class:`~feedfast.order.shardrange.WindowShuffle`,
:class:`~feedfast.order.block.BlockOrder`), for :class:`~feedfast.sources.memberread.MemberReader`.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol

import numpy as np

MERGE_BYTES = 16 << 20
"""Neighbouring windows of a shard wanted at once are read in one request of at most this many bytes (more
when one window alone is larger): on loopback moto's S3 server costs about 4 ms of CPU a request whatever
its size, and a request to a real object store costs a round trip and a fee."""


class Windows(Protocol):
    """The windows of an epoch's order: what :class:`WindowCache` asks of it (:class:`~feedfast.order.block.BlockOrder`,
    :class:`~feedfast.order.shardrange.WindowShuffle`). An order whose windows are read spread over rows also has
    ``place(window) -> int`` (where in the rank's order, -1: not this rank's) and ``horizon`` (over how many
    rows): then :class:`WindowCache` widens reads to the neighbouring windows read within that horizon."""

    def window_of(self, samples: np.ndarray) -> np.ndarray: ...

    def members(self, window: int) -> np.ndarray: ...


class WindowCache:
    """Whole windows of consecutive samples, each read once in a large range and kept while its samples are served.

    A windowed shuffle (:class:`feedfast.order.shardrange.WindowShuffle`) or a block shuffle
    (:class:`feedfast.order.block.BlockOrder`) takes each step's samples from windows of
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
