"""Remote shards for the CPU paths (``threads``, ``pil``): each step's member bytes read by range, ahead of decoding.

The threaded path reads local shards with ``pread`` (:mod:`.shardfiles`); a dataset with any
shard of another kind (``http``, ``s3``, ``gs``, ``cache``: a ``pipe:`` shard, or one downloaded
for ``on_error: skip``) is read here instead, through the transport layer
(:mod:`.transport`) and the reader DALI's feed reads through too (:class:`~feedfast.sources.memberread.MemberReader`),
so the rules are the ones DALI's feed already keeps:

- the order is the epoch's rows (:mod:`.rows`): under the global order every sample is one
  ranged request, merged into one where a read's members lie within 256 KB of each other
  (consecutive samples of a shard); under the block shuffle each window of consecutive samples
  is one request, kept until its samples are served (on the threaded path; a ``pil`` worker
  process reads its batch's rows, merged where adjacent); unshuffled, a step's samples of a
  shard are one request;
- every ranged read of a remote or cached shard starts one tar block early and checks that each
  member sits right after its own header, so a stale or wrong index is an error naming the
  shard and sample, never a mislabelled sample (:mod:`.memberheader`);
- a read that fails (a short body, a cut tar, a timeout past the transport's retries and
  deadline) is a :class:`~feedfast.shards.transport.remote.RemoteError` naming the shard, the first
  sample of the read and the transport's reason. Under ``on_error: skip`` remote shards were
  downloaded and checked when the dataset was opened (:func:`~feedfast.sources.dataset.open_shards`),
  so their damage was counted there, as a local shard's is; one that fails mid-epoch (evicted from the
  shard cache, its source gone) loses its rows (:mod:`.lostrows`).

The bytes are handed over as ``memoryview`` slices of the request's body, not copied: the planned
C path takes any contiguous buffer from memory in place of its ``pread``s (``_plan.c``'s
``plan_batch``, ``_native.c``'s ``sample_batch``, through ``_raws.h``), so remote samples take the
same one-call path as local ones; code that needs ``bytes`` (a label's digits, Pillow's fallback,
the ``pil`` backend) makes them from the slice (:func:`as_bytes`). A slice keeps its request's body
alive until its step is handed over, a few steps past the moment the window cache drops it.

Read-ahead (:class:`StepReads`): a step's rows are read in parts of :data:`PART` rows on
threads of their own, two per decoding thread and at least :data:`READERS` (the requests wait on
sockets without the GIL); under the block shuffle the windows of the steps queued at once are
asked for together first, as many requests at once, so that neighbouring windows of a shard become
one request (up to 16 MB, :data:`~feedfast.sources.windows.MERGE_BYTES`), widened to the shard's next
windows read within the block (:class:`~feedfast.sources.windows.WindowCache`). A step's
reads are queued when its batch is queued for decoding and :data:`AHEAD` steps further, so the
reads are ``prefetch + 1 + AHEAD`` batches ahead of the consumer and a batch's decoding starts
on bytes that are already there while the network keeps up. What is held is bounded by the
same count of batches of compressed bytes (a batch of 64 photos: about 7 MB); a step's bytes
are dropped when its batch is handed over.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

from feedfast.errors import ShardError
from feedfast.shards.transport import schemes
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import RemoteError, Transfer
from feedfast.shards.transport.shardfiles import ShardFiles
from feedfast.sources.lostrows import LostShards
from feedfast.sources.memberread import MISSING, MemberReader

PART = 16
"""Rows read by one task: a step of 64 is read in 4 parts at once (per-sample requests of a global order overlap)."""
READERS = 8
"""Reader threads of an epoch at least (I/O: they wait on sockets without the GIL); and the window requests
at once under the block shuffle. Both grow with the decoding threads (:func:`readers_for`)."""
READERS_PER_THREAD = 2
"""Requests in flight per decoding thread: one such thread decodes about 30 to 80 MB/s of photos, while a
request to an object store waits tens of ms for its first byte and then reads 50 to 100 MB/s."""
READERS_MAX = 64
"""Reader threads (and window requests) at most: each holds a connection to the shards' server."""
AHEAD = 2
"""Steps read past the last step queued for decoding."""

log = logging.getLogger("feedfast.rangeread")
_NAMED = re.compile(r"sample '([^']*)'")
"""A sample an error's message already names (the index check names the sample whose member is misplaced)."""

Columns = list[list["memoryview | None"]]
"""Per component, each row's member bytes, a slice of the request that read them (None: no such member)."""


def readers_for(threads: int) -> int:
    """Reader threads (and window requests at once) for ``threads`` decoding threads."""
    return min(READERS_MAX, max(READERS, READERS_PER_THREAD * threads))


def as_bytes(member: "bytes | memoryview | None") -> bytes:
    """A member's bytes as ``bytes`` (``b""`` for None): for code that parses them in Python."""
    if member is None:
        return b""
    return member if isinstance(member, bytes) else bytes(member)


def remote(kinds: Sequence[str]) -> bool:
    """Whether a dataset's shards (``ShardSet.read_kinds``) are read here rather than by ``pread``."""
    return any(kind != schemes.FILE.name for kind in kinds)


def unranged(kinds: Sequence[str]) -> str | None:
    """The first read kind that has no ranged reads (the CPU paths cannot read it), None when all have."""
    return next((kind for kind in kinds if not schemes.kind(kind).ranged), None)


class RangeSource:
    """The member bytes of a rank's rows, read through each shard's transport; picklable (a ``pil`` worker
    process makes its own reader).

    Args:
        names, kinds: the shards (paths or URLs) and how each is read (``ShardSet.read_kinds``).
        rows: the rank's rows of the epoch (:class:`~feedfast.order.rows.Rows`).
        cache, transfer: the shard cache (``cache`` shards) and the remote settings.
        windows: under the block shuffle, read each window whole and hold it until its samples are
            served (one process reads every step: the threaded path); False reads only the rows asked
            for, merged where adjacent (a ``pil`` worker process sees only some of the steps, and would
            hold the windows it never finishes).
        skip: ``on_error: skip``: a shard that cannot be read (evicted from the shard cache and not fetched
            again, or no longer matching its index) loses its rows instead of failing the read
            (:mod:`.lostrows`): their members are None and :attr:`lost` gives each one's reason.
    """

    def __init__(self, names: tuple[str, ...], kinds: tuple[str, ...], rows: Any, *, cache: ShardCache | None,
                 transfer: Transfer, windows: bool = True, skip: bool = False, requests: int = READERS) -> None:
        self.names, self.kinds, self.rows, self.cache, self.transfer = names, kinds, rows, cache, transfer
        self.windows, self.skip, self.requests = windows, skip, requests
        self.lost_shards = LostShards(names, rows.shards, rows.index.components) if skip else None
        self._member_reader: MemberReader | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"names": self.names, "kinds": self.kinds, "rows": self.rows, "cache": self.cache,
                "transfer": self.transfer, "windows": self.windows, "skip": self.skip, "requests": self.requests}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["names"], state["kinds"], state["rows"], cache=state["cache"],  # type: ignore[misc]
                      transfer=state["transfer"], windows=state["windows"], skip=state["skip"],
                      requests=state["requests"])

    def _reader(self) -> MemberReader:
        with self._lock:
            if self._member_reader is None:
                self._member_reader = MemberReader(self.names, self.kinds, self.rows, cache=self.cache,
                                                   transfer=self.transfer, files=ShardFiles(self.names),
                                                   windows=self.windows, requests=self.requests)
            return self._member_reader

    @property
    def lost(self) -> dict[int, str]:
        """Row -> why its shard could not be read (under skip; empty otherwise)."""
        return self.lost_shards.lost if self.lost_shards is not None else {}

    def want(self, rows: list[int]) -> None:
        """Start reading the windows of ``rows`` (whole steps of a read-ahead), without waiting: under the block
        shuffle, neighbouring windows of a shard wanted at once are read in one request
        (:class:`~feedfast.sources.windows.WindowCache`); a failure is raised by the :meth:`read` that needs them."""
        self._reader().want(self.lost_shards.live(rows) if self.lost_shards is not None else rows)

    def read(self, rows: list[int]) -> Columns:
        """Per component, the members of ``rows`` (row numbers of the rank's epoch), read now.

        Raises:
            RemoteError: a read failed or did not match the index; names the shard, the first sample of the
                read and the reason (not under ``skip``: see the class).
        """
        if self.lost_shards is not None:
            arrays = self.lost_shards.read(rows, self._reader().members)
        else:
            try:
                arrays = self._reader().members(rows)
            except ShardError as exc:
                raise self._named(exc, self.rows.take(rows)) from exc
        return [[None if array is None or array is MISSING else memoryview(array) for array in column]
                for column in arrays]

    def _named(self, exc: ShardError, where: Any) -> RemoteError:
        """``exc`` as an error naming the shard and sample: the sample ``exc`` names (an index that does not match
        the tar; under the block shuffle maybe one of the window read with the rows), else the first of the failed
        read in the shard ``exc`` names."""
        shards, keys, text = where.shard.tolist(), self.rows.index.batch_keys(where), str(exc)
        url = getattr(exc, "url", None)
        at = next((i for i, s in enumerate(shards) if self.names[s] == url or repr(self.names[s]) in text), 0)
        name = self.names[shards[at]]
        named = _NAMED.search(text)
        if named is not None:
            return RemoteError(f"cannot read sample {named.group(1)!r} of shard {name!r}: {exc}", url=name,
                               status=getattr(exc, "status", None))
        others = sum(self.names[s] == name for s in shards) - 1
        more = f" (read with {others} more of its samples)" if others > 0 else ""
        return RemoteError(f"cannot read sample {keys[at]!r} of shard {name!r}{more}: {exc}", url=name,
                           status=getattr(exc, "status", None))

    def close(self) -> None:
        """Stop the reader's window threads and close the local shards it opened."""
        with self._lock:
            reader, self._member_reader = self._member_reader, None
        if reader is not None:
            reader.close()


class StepReads:
    """Each step's member bytes, read ahead on threads of their own (see the module docstring).

    Args:
        source: what reads rows.
        step_rows: a step -> its row numbers (padding included), in batch order.
        steps: the steps of the epoch.
        readers, ahead: reader threads, and steps read past the last one asked for.
    """

    def __init__(self, source: RangeSource, step_rows: Callable[[int], list[int]], *, steps: int,
                 readers: int = READERS, ahead: int = AHEAD) -> None:
        self.source, self.step_rows, self.steps, self.ahead = source, step_rows, steps, ahead
        self._pool = ThreadPoolExecutor(max_workers=max(1, readers), thread_name_prefix="feedfast-range")
        self._parts: dict[int, list[Future[Columns]]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.chunks = 0  # chunks asked for
        self.waits = 0  # of them, those whose bytes were not read yet
        self.waited = 0.0  # seconds decoding waited on the network, over all threads

    def want(self, step: int) -> None:
        """Queue the reads of ``step`` and of the :data:`AHEAD` steps after it (those not queued yet)."""
        with self._lock:
            if self._closed:
                return
            queued = {s: self.step_rows(s) for s in range(step, min(self.steps, step + self.ahead + 1))
                      if s not in self._parts}
            if queued:
                self.source.want([r for rows in queued.values() for r in rows])
            for s, rows in queued.items():
                self._parts[s] = [self._pool.submit(self.source.read, rows[lo: lo + PART])
                                  for lo in range(0, len(rows), PART)]

    def chunk(self, step: int, a: int, b: int, *, count: bool = True) -> Columns:
        """Per component, the bytes of rows ``a .. b`` of step ``step``'s batch (waits for their reads); counted
        in :attr:`chunks` and :attr:`waits` unless ``count`` is False (the same chunk asked for again).

        Raises:
            RemoteError: one of their reads failed (see :meth:`RangeSource.read`).
        """
        with self._lock:
            parts = self._parts.get(step)
        if parts is None:
            self.want(step)
            with self._lock:
                parts = self._parts.get(step)
            if parts is None:
                raise ShardError(f"step {step} was asked for after the epoch's remote reads were closed")
        got: Columns = []
        pending = [parts[p] for p in range(a // PART, (b - 1) // PART + 1) if not parts[p].done()]
        if pending:
            started = time.perf_counter()
            for future in pending:
                future.exception()  # waits; a failure is raised below, by result()
            with self._lock:
                self.waits += int(count)
                self.waited += (time.perf_counter() - started) * count
        with self._lock:
            self.chunks += int(count)
        for p in range(a // PART, (b - 1) // PART + 1):
            part = parts[p].result()
            lo, hi = max(a, p * PART) - p * PART, min(b, (p + 1) * PART) - p * PART
            if not got:
                got = [column[lo:hi] for column in part]
            else:
                for column, more in zip(got, part):
                    column.extend(more[lo:hi])
        return got

    def lost(self, step: int, a: int, b: int) -> dict[int, str]:
        """Rows ``a .. b`` of step ``step``'s batch whose shard could not be read (under skip; after
        :meth:`chunk` of them), by batch row, with the reason."""
        if not self.source.lost:
            return {}
        rows = self.step_rows(step)
        return {i: self.source.lost[rows[i]] for i in range(a, b) if rows[i] in self.source.lost}

    def held(self) -> int:
        """Steps whose reads are queued or held."""
        with self._lock:
            return len(self._parts)

    def release(self, step: int) -> None:
        """Drop ``step``'s bytes (its batch was handed over), and those of any earlier step."""
        with self._lock:
            for s in [s for s in self._parts if s <= step]:
                for part in self._parts.pop(s):
                    part.cancel()

    def close(self) -> None:
        """Stop the readers (queued reads are dropped) and the source."""
        with self._lock:
            self._closed = True
            parts, self._parts = self._parts, {}
        for futures in parts.values():
            for part in futures:
                part.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.source.close()
        log.debug("remote reads: decoding waited on %d of %d chunks, %.3f s in all", self.waits, self.chunks,
                  self.waited)


def epoch_reads(shards: Any, rows: Any, ep: Any, *, batch_size: int, skip: bool = False,
                threads: int = 1) -> StepReads | None:
    """The read-ahead of a rank's epoch over ``shards`` (a ShardSet) when any shard is not local, else None;
    ``skip``: a shard that cannot be read loses its rows (:class:`RangeSource`); ``threads``: the decoding
    threads, which the readers grow with (:func:`readers_for`)."""
    if not remote(shards.read_kinds):
        return None
    from feedfast.order.deal import step_positions

    readers = readers_for(threads)
    source = RangeSource(shards.paths, shards.read_kinds, rows, cache=shards.cache, transfer=shards.transfer,
                         skip=skip, requests=readers)
    return StepReads(source, lambda step: step_positions(step, batch_size, ep.rank_samples, ep.batch_sizes[step]),
                     steps=ep.steps, readers=readers)
