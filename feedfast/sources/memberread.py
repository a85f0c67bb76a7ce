"""Reading a rank's members by offset, whatever the shard's transport: the one reader of DALI's feed and
the CPU paths' range reads.

The index of a shard read from elsewhere (http, s3, gs, the shard cache) is checked as it is
read: each read starts one block early, so it holds the tar header before every member it
reads, and a member that is not where its header says it is (an index whose offsets point
at the next sample, or that belongs to another version of the shard) is an error naming the
shard, the sample and the offset, never a mislabelled sample. The check costs 512 bytes a
read, one key read a sample and about 1 us a member (:func:`.memberheader.first_problem`).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from feedfast.errors import ShardError
from feedfast.shards.tar.memberheader import BLOCK, first_problem
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import Transfer
from feedfast.shards.transport.shardfiles import ShardFiles
from feedfast.shards.transport.transport import Transport, transport_for
from feedfast.sources.windows import WindowCache

MAX_GAP = 256 * 1024
LOCAL_GAP = 16 * 1024  # a local read is a syscall and a copy, not a request: merge only near neighbours
Span = tuple[int, int, int, int]  # (offset, size, row, component)
EMPTY = np.empty(0, dtype=np.uint8)
"""A member of no bytes."""
MISSING = np.empty(0, dtype=np.uint8)
"""No such member (a sample without that component): empty as well, for DALI; a reader that tells the two
apart compares with ``is``."""


class MemberReader:
    """Per component, the members of a rank's rows, read by offset: local shards by ``pread`` (kept open),
    others by range through their transport or the shard cache, windows at a time under a windowed order.

    Args:
        names: shard names (paths or URLs), by shard number.
        kinds: how each shard is read: ``file``, ``http`` or ``cache``.
        rows: the rank's samples in reading order (:class:`feedfast.order.rows.Rows`).
        cache, transfer: the shard cache and the remote settings.
        windows: read a windowed or block order's samples a whole window at a time, held until served
            (False: only the samples asked for, merged where near: a reader that sees only some of the
            steps, such as one DataLoader worker process of several, would hold windows it never finishes).
        requests: window reads at once (:class:`~feedfast.sources.windows.WindowCache`).
        files: the local shards' descriptors (opened as first read; shared with another reader of them).
    """

    def __init__(self, names: tuple[str, ...], kinds: tuple[str, ...], rows: Any, *, cache: ShardCache | None,
                 transfer: Transfer, files: ShardFiles, windows: bool = True, requests: int = 8) -> None:
        self.names, self.kinds = names, kinds
        self.rows = rows
        self.components = rows.index.components
        self.cache, self.transfer = cache, transfer
        self._windows = WindowCache(rows.window if windows else None, self._fetch_samples, requests=requests,
                                    nbytes=self._bytes, shard_of=self._shard_of)
        self._transports: dict[int, Transport] = {}
        self.files = files  # local shards stay open: a shuffled epoch reads sample by sample
        if self._windows._io is not None:
            weakref.finalize(self, self._windows._io.shutdown, wait=False)
        weakref.finalize(self, self.files.close)

    def close(self) -> None:
        """Stop the window reads and close the shards."""
        self._windows.close()
        self.files.close()

    def want(self, rows: list[int]) -> None:
        """Start reading the windows of ``rows`` not read yet (a read-ahead's whole steps: neighbouring windows
        wanted at once become one request), without waiting; nothing to do outside a windowed or block order."""
        if self._windows.active:
            self._windows.want(self.rows.samples(rows).tolist())

    def members(self, rows: list[int]) -> list[list[np.ndarray]]:
        """Per component, the members of ``rows`` (the rank's row numbers, in that order), read now: from their
        windows under a windowed or block order, else in ranged reads merged where members are near."""
        if self._windows.active:
            samples = self.rows.samples(rows).tolist()
            held = self._windows.rows(samples)
            return [[held[s, c] for s in samples] for c in range(self.components)]
        return self.unwindowed(rows)

    def unwindowed(self, rows: list[int]) -> list[list[np.ndarray]]:
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
