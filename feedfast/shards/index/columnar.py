"""One columnar index per dataset: where every sample's components are, as fixed-size records.

The per-shard text indexes (``v1.2``, :mod:`.index`) are what DALI's reader wants; parsing
them into Python objects costs about 13 us a sample, on every rank, at every start. This
module reads them once per dataset into arrays and keeps those in the cache folder::

    <cache>/columnar/<digest>/
        rows.npy     int64 [samples, 2 * components + 2]: per sample, each component's data
                     offset (its first member in tar order), each one's size (-1: the sample
                     has no such member), and where its key starts in keys.bin and its length
        keys.bin     the keys, UTF-8, back to back
        starts.npy   int64 [shards + 1]: the first sample number of each shard

Samples are numbered in the canonical concatenation of the dataset's shards (shard 0's
indexed samples first). The digest covers the shard paths, their index files (path, size and
modification time) and the component extensions, so an index rewritten since is never read
through a stale copy. Opening costs O(shards) (the digest stats each index file once).

A batch's records are read with ``pread`` (one read per run of consecutive samples, one per
key), not mapped: the files stay in the page cache, shared by the ranks of a node, and a
process holds only the batches it asked for. (Mapped, a shuffled batch of 256 samples of a
100M-sample index was seen to map 1.8 GB into the process: the kernel maps the page cache's
2 MB folios whole, and the pages count in every rank's resident memory.)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from feedfast.errors import ShardError
from feedfast.shards.index.notes import parse_header
from feedfast.shards.index.tarindex import INDEX_VERSION, split_name, unescape_name

try:  # the records of a shuffled batch read in one call (feedfast/_plan.c), where it is built
    from feedfast._plan import gather as _gather
except ImportError:
    _gather = None

FORMAT = 2  # bump when the layout or what a column means changes
_OPEN: dict[tuple[Any, ...], "ColumnarIndex"] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class RowBatch:
    """Some samples' locations, as arrays (one entry per row asked for, in that order).

    Attributes:
        samples: canonical sample numbers (the per-sample random draws are keyed by them).
        shard: each sample's shard number.
        offsets, sizes: (offset, size) per sample and component; size -1: no such member.
        key_at, key_len: where each sample's key is in the index's key file.
        draws: under repeated augmentation, what each row's draws are keyed by (its copy's own number,
            :func:`feedfast.order.repeats.draw_ids`); None: the sample numbers.
    """

    samples: np.ndarray
    shard: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    key_at: np.ndarray
    key_len: np.ndarray
    draws: np.ndarray | None = None

    @property
    def draw_ids(self) -> np.ndarray:
        """What each row's augmentation draws are keyed by."""
        return self.samples if self.draws is None else self.draws


class KeyIndex(Protocol):
    """What :class:`Origins` reads of an index: a batch's keys (a :class:`ColumnarIndex`, a folder's index)."""

    def batch_keys(self, rows: RowBatch) -> list[str]: ...


class Origins(Sequence[tuple[str, str]]):
    """Each row's (shard name, sample key), read from the index the first time any is asked for.

    A batch carries its origins; most loops never look at them, so their keys are not read
    until then (a key costs one ``pread``).
    """

    def __init__(self, index: KeyIndex, names: Sequence[str], rows: RowBatch) -> None:
        self._index, self._names, self._rows = index, names, rows
        self._items: list[tuple[str, str]] | None = None

    def _list(self) -> list[tuple[str, str]]:
        if self._items is None:
            keys = self._index.batch_keys(self._rows)
            self._items = [(self._names[s], k) for s, k in zip(self._rows.shard.tolist(), keys)]
        return self._items

    def __len__(self) -> int:
        return len(self._rows.samples)

    def __getitem__(self, i: Any) -> Any:
        return self._list()[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(self._list())

    def lazy(self, i: int) -> Sequence[str]:
        """Row ``i``'s (shard, key), read only if an item of it is asked for."""
        return _Origin(self, i)


class _Origin(Sequence[str]):
    """One row's (shard, key) of :class:`Origins`, resolved on first use."""

    def __init__(self, origins: Origins, i: int) -> None:
        self._origins, self._i = origins, i

    def __len__(self) -> int:
        return 2

    def __getitem__(self, k: Any) -> Any:
        return self._origins[self._i][k]


class ColumnarIndex:
    """A dataset's samples as fixed-size records on disk (see the module docstring); picklable by path."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.starts = np.load(folder / "starts.npy")
        self._rows = os.open(folder / "rows.npy", os.O_RDONLY)
        self._key_file = os.open(folder / "keys.bin", os.O_RDONLY)
        with open(folder / "rows.npy", "rb") as f:
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, _ = header(f)
            self._first = f.tell()
        self.components = (shape[1] - 2) // 2
        self._width = 8 * shape[1]
        weakref.finalize(self, _close, self._rows, self._key_file)

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return ColumnarIndex, (self.folder,)  # a worker process opens the files itself

    def __len__(self) -> int:
        return int(self.starts[-1])

    def shard_of(self, samples: np.ndarray) -> np.ndarray:
        """The shard number of each sample."""
        return (np.searchsorted(self.starts, samples, side="right") - 1).astype(np.int32)

    def records(self, samples: np.ndarray) -> np.ndarray:
        """The records of ``samples`` (int64 [n, 2 * components + 2]), one read per run of consecutive samples."""
        samples = np.asarray(samples, dtype=np.int64)
        out = np.empty((len(samples), self._width // 8), dtype=np.int64)
        if not len(samples):
            return out
        if samples.min() < 0 or samples.max() >= len(self):
            raise IndexError(f"sample numbers outside [0, {len(self)})")
        order = np.argsort(samples, kind="stable")
        ordered = samples[order]
        width, fd, base = self._width, self._rows, self._first
        bounds = [0, *(np.flatnonzero(np.diff(ordered) != 1) + 1).tolist(), len(samples)]
        if _gather is not None and 2 * len(bounds) > len(samples):  # mostly apart (a shuffled batch): in C,
            gathered = np.empty_like(out)  # one read each, without the GIL
            if _gather(fd, base + ordered * width, width, gathered):
                out[order] = gathered
                return out
        firsts = ordered[bounds[:-1]].tolist()
        if len(firsts) == len(samples):  # no two consecutive: one read each
            out[order] = np.frombuffer(b"".join(os.pread(fd, width, base + f * width) for f in firsts),
                                       dtype=np.int64).reshape(len(samples), -1)
            return out
        for a, b, first in zip(bounds[:-1], bounds[1:], firsts):
            data = os.pread(fd, (b - a) * width, base + first * width)
            out[order[a:b]] = np.frombuffer(data, dtype=np.int64).reshape(b - a, -1)
        return out

    def take(self, samples: Sequence[int] | np.ndarray) -> RowBatch:
        """The locations of ``samples`` (canonical numbers)."""
        samples = np.asarray(samples, dtype=np.int64)
        rec = self.records(samples)
        c = self.components
        return RowBatch(samples, self.shard_of(samples), rec[:, :c], rec[:, c: 2 * c], rec[:, -2], rec[:, -1])

    def key(self, sample: int) -> str:
        """The key of one sample."""
        return self.keys([sample])[0]

    def keys(self, samples: Sequence[int] | np.ndarray) -> list[str]:
        """The keys of ``samples``."""
        return self.batch_keys(self.take(samples))

    def batch_keys(self, rows: RowBatch) -> list[str]:
        """The keys of a batch already taken: one read per key, or one for all where they lie end to end in the
        key file (consecutive samples: a window's, a shard's run)."""
        at, n = rows.key_at, rows.key_len
        if len(at) > 1 and np.array_equal(at[1:], at[:-1] + n[:-1]):
            data = os.pread(self._key_file, int(at[-1] + n[-1] - at[0]), int(at[0]))
            ends = (at + n - at[0]).tolist()
            return [data[a:b].decode("utf-8", "surrogateescape") for a, b in zip([0, *ends[:-1]], ends)]
        return [os.pread(self._key_file, k, a).decode("utf-8", "surrogateescape")
                for a, k in zip(at.tolist(), n.tolist())]


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def _files(paths: Sequence[str], index_paths: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """(inode, mtime) of each index: one stat each (about 1 ms for 1,024 shards)."""
    try:
        return tuple((st.st_ino, st.st_mtime_ns) for st in map(os.stat, index_paths))
    except OSError as exc:
        raise ShardError(f"cannot read an index of {paths[0] if paths else '?'!r}: {exc}") from exc


def _digest(paths: Sequence[str], index_paths: Sequence[str], counts: Sequence[int],
            exts: Sequence[Sequence[str]]) -> str:
    h = hashlib.sha256(f"feedfast-columnar/{FORMAT}/{json.dumps([sorted(e) for e in exts])}".encode())
    for path, index, count in zip(paths, index_paths, counts):
        try:
            st = os.stat(index)
        except OSError as exc:
            raise ShardError(f"cannot read the index {index!r} of {path!r}: {exc.strerror}") from exc
        h.update(f"\n{path}\0{os.path.abspath(index)}\0{count}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def dataset_index(paths: Sequence[str], index_paths: Sequence[str], counts: Sequence[int],
                  exts: Sequence[set[str] | frozenset[str]], cache_dir: Path) -> ColumnarIndex:
    """The columnar index of these shards for these components: opened, or built once and cached.

    Args:
        paths, index_paths, counts: the dataset's shards, their (filtered) text indexes and the
            samples each lists (:class:`~feedfast.sources.dataset.ShardSet`).
        exts: each component's extensions (lower case); a component's offset is its first
            member in tar order with one of them, as DALI's reader picks it.
        cache_dir: feedfast's cache folder.

    Raises:
        ShardError: an index cannot be read, or lists another number of samples than ``counts``.
    """
    wanted = [frozenset(e) for e in exts]
    # opened once per process for the same index files: the files it was built from were checked when the
    # dataset was opened (feedfast.shards.index.snapshot); an index rewritten since (a shard indexed again after it
    # changed) is another file (write_atomic renames a new one into place), so its (inode, mtime) is in the key
    name = (tuple(paths), tuple(index_paths), tuple(counts), tuple(tuple(sorted(e)) for e in wanted), str(cache_dir),
            _files(paths, index_paths))
    with _LOCK:
        found = _OPEN.get(name)
        if found is not None:
            return found
        folder = cache_dir / "columnar" / _digest(paths, index_paths, counts, [sorted(e) for e in wanted])
        if not (folder / "done").is_file():
            _build(folder, paths, index_paths, counts, wanted)
        opened = _OPEN[name] = ColumnarIndex(folder)
        while len(_OPEN) > 8:
            _OPEN.pop(next(iter(_OPEN)))
        return opened


def _build(folder: Path, paths: Sequence[str], index_paths: Sequence[str], counts: Sequence[int],
           exts: list[frozenset[str]]) -> None:
    """Parse the text indexes into the arrays and move the folder into place whole."""
    total = int(sum(counts))
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    c = len(exts)
    try:
        rows = _column(tmp / "rows.npy", (total, 2 * c + 2))
        rows[:, c: 2 * c] = -1
        at, written = 0, 0
        with open(tmp / "keys.bin", "wb") as keys:
            for path, index, count in zip(paths, index_paths, counts):
                part = rows[at: at + count]
                blob, lens = _parse_into(index, path, count, exts, part[:, :c], part[:, c: 2 * c])
                keys.write(blob)
                ends = written + np.cumsum(np.asarray(lens, dtype=np.int64))
                part[:, -1] = lens
                part[:, -2] = ends - part[:, -1]
                written += len(blob)
                at += count
        np.save(tmp / "starts.npy", np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]))
        if isinstance(rows, np.memmap):
            rows.flush()
        else:
            np.save(tmp / "rows.npy", rows)
        del rows
        (tmp / "done").write_text("", encoding="utf-8")
        try:
            os.replace(tmp, folder)
        except OSError:  # another process built it meanwhile
            if not (folder / "done").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _column(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """An int64 array written straight to its ``.npy`` file (in memory when empty: a map needs a byte)."""
    if not all(shape):
        return np.zeros(shape, dtype=np.int64)
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=shape)


def _parse_into(index: str, path: str, count: int, exts: list[frozenset[str]], offsets: np.ndarray,
                sizes: np.ndarray) -> tuple[bytes, list[int]]:
    """Fill one shard's rows from its text index; its keys (UTF-8, back to back) and their lengths."""
    try:
        with open(index, "rb") as f:
            first, rest = f.readline().decode("utf-8"), f.read().decode("utf-8")
        declared = parse_header(first.rstrip("\r\n"), INDEX_VERSION).count
    except (OSError, UnicodeDecodeError) as exc:
        raise ShardError(f"cannot read the index {index!r} of {path!r}: {exc}") from exc
    except ValueError as exc:
        raise ShardError(f"the index {index!r} of {path!r} is not a {INDEX_VERSION} webdataset index ({exc})") from None
    lines = [line for line in rest.split("\n") if line.strip()]  # escaped names hold no line break but \n's
    if len(lines) != declared:
        raise ShardError(f"the index {index!r} of {path!r} declares {declared} samples on its first line but "
                         f"lists {len(lines)}: it is damaged; open the shards again")
    if len(lines) != count:
        raise ShardError(f"the index {index!r} of {path!r} now lists {len(lines)} samples, not {count}: "
                         "the shard changed since it was opened; open it again")
    parts: list[bytes] = []
    lens: list[int] = []
    try:
        for row, line in enumerate(lines):
            fields = line.rstrip("\r").split(" ")
            for c, wanted in enumerate(exts):
                for i in range(0, len(fields) - 3, 4):
                    if unescape_name(fields[i]).lower() in wanted:
                        offsets[row, c], sizes[row, c] = int(fields[i + 1]), int(fields[i + 2])
                        break
            key = split_name(unescape_name(fields[3]))[0].encode("utf-8", "surrogateescape")
            parts.append(key)
            lens.append(len(key))
    except (IndexError, ValueError, OverflowError) as exc:
        raise ShardError(f"the index {index!r} of {path!r} is damaged at sample {len(lens)}: {exc}") from exc
    _check_bounds(index, path, offsets, sizes)
    return b"".join(parts), lens


def _check_bounds(index: str, path: str, offsets: np.ndarray, sizes: np.ndarray) -> None:
    """Every listed member of a local shard after its first header and inside the file."""
    try:
        total = os.path.getsize(path)
    except OSError:
        return  # a remote shard (its index was checked when it was fetched)
    there = sizes >= 0
    bad = there & ((offsets < 512) | (offsets + sizes > total))
    if bad.any():
        row, c = (int(v[0]) for v in np.nonzero(bad))
        raise ShardError(f"the index {index!r} of {path!r} puts sample {row}'s component {c} at offset "
                         f"{int(offsets[row, c])} (size {int(sizes[row, c])}), outside the shard's {total} bytes")
