"""One columnar, memory-mapped index per dataset: where every sample's components are, as arrays.

The per-shard text indexes (``v1.2``, :mod:`.index`) are what DALI's reader wants; parsing
them into Python objects costs about 13 us a sample, on every rank, at every start. This
module reads them once per dataset into arrays and keeps those in the cache folder::

    <cache>/columnar/<digest>/
        offsets.npy   int64 [samples, components]  data offset of each component (first match)
        sizes.npy     int64 [samples, components]  its size; -1: the sample has no such member
        key_ends.npy  int64 [samples]              end of each sample's key in keys.bin
        keys.bin      the keys, UTF-8, back to back
        starts.npy    int64 [shards + 1]           first sample number of each shard

Samples are numbered in the canonical concatenation of the dataset's shards (shard 0's
indexed samples first). The digest covers the shard paths, their index files (path, size and
modification time) and the component extensions, so an index rewritten since is never read
through a stale copy. The arrays are opened with ``mmap``: a rank touches only the pages of
the samples it reads, and the ranks of a node share them through the page cache. Opening
costs O(shards) (the digest stats each index file once); nothing grows with samples.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from feedfast.errors import ShardError
from feedfast.sources.index import INDEX_VERSION, split_name, unescape_name

FORMAT = 1  # bump when the layout or what a column means changes
_OPEN: dict[str, "ColumnarIndex"] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class RowBatch:
    """Some samples' locations, as arrays (one entry per row asked for, in that order).

    Attributes:
        samples: canonical sample numbers (the per-sample random draws are keyed by them).
        shard: each sample's shard number.
        offsets, sizes: (offset, size) per sample and component; size -1: no such member.
    """

    samples: np.ndarray
    shard: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray


class ColumnarIndex:
    """A dataset's samples as memory-mapped arrays (see the module docstring); picklable by path."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.starts = np.load(folder / "starts.npy")
        self.offsets = np.load(folder / "offsets.npy", mmap_mode="r")
        self.sizes = np.load(folder / "sizes.npy", mmap_mode="r")
        self.key_ends = np.load(folder / "key_ends.npy", mmap_mode="r")
        self._keys = np.memmap(folder / "keys.bin", dtype=np.uint8, mode="r") if (folder / "keys.bin").stat().st_size \
            else np.zeros(0, dtype=np.uint8)

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return ColumnarIndex, (self.folder,)  # a worker process maps the files itself

    def __len__(self) -> int:
        return int(self.starts[-1])

    def shard_of(self, samples: np.ndarray) -> np.ndarray:
        """The shard number of each sample."""
        return (np.searchsorted(self.starts, samples, side="right") - 1).astype(np.int32)

    def take(self, samples: np.ndarray) -> RowBatch:
        """The locations of ``samples`` (canonical numbers), gathered from the mapped arrays."""
        samples = np.asarray(samples, dtype=np.int64)
        return RowBatch(samples, self.shard_of(samples), self.offsets[samples], self.sizes[samples])

    def key(self, sample: int) -> str:
        """The key of one sample."""
        start = int(self.key_ends[sample - 1]) if sample > 0 else 0
        return bytes(self._keys[start: int(self.key_ends[sample])]).decode("utf-8")

    def keys(self, samples: Sequence[int] | np.ndarray) -> list[str]:
        """The keys of ``samples``."""
        return [self.key(int(s)) for s in samples]


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
    digest = _digest(paths, index_paths, counts, [sorted(e) for e in wanted])
    with _LOCK:
        found = _OPEN.get(digest)
        if found is not None:
            return found
        folder = cache_dir / "columnar" / digest
        if not (folder / "done").is_file():
            _build(folder, paths, index_paths, counts, wanted)
        opened = _OPEN[digest] = ColumnarIndex(folder)
        while len(_OPEN) > 8:
            _OPEN.pop(next(iter(_OPEN)))
        return opened


def _build(folder: Path, paths: Sequence[str], index_paths: Sequence[str], counts: Sequence[int],
           exts: list[frozenset[str]]) -> None:
    """Parse the text indexes into the arrays and move the folder into place whole."""
    total = int(sum(counts))
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        offsets, sizes, key_ends = (_column(tmp / name, shape) for name, shape in (
            ("offsets.npy", (total, len(exts))), ("sizes.npy", (total, len(exts))), ("key_ends.npy", (total,))))
        sizes[:] = -1
        at, written = 0, 0
        with open(tmp / "keys.bin", "wb") as keys:
            for path, index, count in zip(paths, index_paths, counts):
                blob, lens = _parse_into(index, path, count, exts, offsets[at: at + count], sizes[at: at + count])
                keys.write(blob)
                key_ends[at: at + count] = written + np.cumsum(lens)
                written += len(blob)
                at += count
        np.save(tmp / "starts.npy", np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]))
        for column in (offsets, sizes, key_ends):
            if isinstance(column, np.memmap):
                column.flush()
        for name, column in (("offsets.npy", offsets), ("sizes.npy", sizes), ("key_ends.npy", key_ends)):
            if not isinstance(column, np.memmap):
                np.save(tmp / name, column)
        del offsets, sizes, key_ends
        (tmp / "done").write_text("", encoding="utf-8")
        try:
            os.replace(tmp, folder)
        except OSError:  # another process built it meanwhile
            if not (folder / "done").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _column(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """An int64 array written straight to its ``.npy`` file (in memory when empty: mmap needs a byte)."""
    if not all(shape):
        return np.zeros(shape, dtype=np.int64)
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=shape)


def _parse_into(index: str, path: str, count: int, exts: list[frozenset[str]], offsets: np.ndarray,
                sizes: np.ndarray) -> tuple[bytes, list[int]]:
    """Fill one shard's rows from its text index; its keys (UTF-8, back to back) and their lengths."""
    try:
        with open(index, encoding="utf-8") as f:
            header = f.readline().split()
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ShardError(f"cannot read the index {index!r} of {path!r}: {exc}") from exc
    if len(header) != 2 or header[0] != INDEX_VERSION:
        raise ShardError(f"the index {index!r} of {path!r} is not a {INDEX_VERSION} webdataset index")
    lines = [line for line in lines if line.strip()]
    if len(lines) != count:
        raise ShardError(f"the index {index!r} of {path!r} now lists {len(lines)} samples, not {count}: "
                         "the shard changed since it was opened; open it again")
    parts: list[bytes] = []
    lens: list[int] = []
    try:
        for row, line in enumerate(lines):
            fields = line.split(" ")
            for c, wanted in enumerate(exts):
                for i in range(0, len(fields) - 3, 4):
                    if fields[i].lower() in wanted:
                        offsets[row, c], sizes[row, c] = int(fields[i + 1]), int(fields[i + 2])
                        break
            key = split_name(unescape_name(fields[3]))[0].encode("utf-8")
            parts.append(key)
            lens.append(len(key))
    except (IndexError, ValueError, OverflowError) as exc:
        raise ShardError(f"the index {index!r} of {path!r} is damaged at sample {len(lens)}: {exc}") from exc
    return b"".join(parts), lens
