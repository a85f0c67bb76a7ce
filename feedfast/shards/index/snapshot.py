"""What opening a dataset of local shards found, kept so that the next open costs O(shards).

Opening shards (:func:`~feedfast.sources.dataset.open_shards`) reads every shard's index,
applies ``missing`` and checks images: O(samples) of Python, tens of seconds at ImageNet's
size, on every rank at every start. Its result is small: per shard, the index DALI reads
(filtered or not), the samples kept, and the samples left out or re-encoded, by key. So it
is written to ``<cache>/opened/<digest>.json``, the digest covering everything the result
depends on: each shard's path, size and modification time, the components (names,
extensions, kinds), ``missing``, the error policy, the pixel limit, the check's time limit and
rules. The record also holds the size and modification time of every file the result names
(indexes, side shards), and of every shard its content fingerprint
(:func:`~feedfast.shards.index.check.shard_fingerprint`: two small reads a shard), so a shard
rewritten in place with the same size and modification time is caught: a record whose files
changed since is not used, and the shards are opened afresh (their indexes checked against
them). Remote shards are never recorded (knowing they did not change costs a request each).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from feedfast.shards.index.check import fingerprint_matches, shard_fingerprint
from feedfast.shards.index.tarindex import write_atomic

FORMAT = 2


@dataclass(frozen=True)
class Opened:
    """The part of a :class:`~feedfast.sources.dataset.ShardSet` that opening local shards finds."""

    paths: tuple[str, ...]
    index_paths: tuple[str, ...]
    sizes: tuple[int, ...]
    skipped: tuple[tuple[str, str, str], ...]
    converted: tuple[tuple[str, str, str], ...]
    raw_bytes: int


def _identity(path: str, fingerprint: bool = False) -> list[Any]:
    """(path, size, mtime), and the content fingerprint of a shard."""
    st = os.stat(path)
    found = [os.path.abspath(path), st.st_size, st.st_mtime_ns]
    return found + [shard_fingerprint(path, st.st_size)] if fingerprint else found


def _unchanged(path: str, identity: list[Any]) -> bool:
    """Whether the file is as recorded: its path, size, mtime, and a shard's fingerprint (two small reads)."""
    st = os.stat(path)
    if [os.path.abspath(path), st.st_size, st.st_mtime_ns] != identity[:3]:
        return False
    return len(identity) < 4 or fingerprint_matches(path, identity[3], st.st_size)


def digest(shards: Sequence[str], settings: dict[str, Any]) -> str | None:
    """The record's name for these local shards and settings; None when a shard is missing (no record)."""
    h = hashlib.sha256(json.dumps([FORMAT, settings], sort_keys=True).encode())
    try:
        for path in shards:
            h.update(json.dumps(_identity(path)).encode())
    except OSError:
        return None
    return h.hexdigest()[:24]


def load(cache_dir: Path, name: str) -> Opened | None:
    """The recorded result, if there is one and every file it names is as it was."""
    record = cache_dir / "opened" / f"{name}.json"
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        if data["format"] != FORMAT or not all(_unchanged(p, list(i)) for p, i in data["files"]):
            return None
        return Opened(tuple(data["paths"]), tuple(data["index_paths"]), tuple(data["sizes"]),
                      tuple(map(tuple, data["skipped"])), tuple(map(tuple, data["converted"])),  # type: ignore[arg-type]
                      int(data["raw_bytes"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(cache_dir: Path, name: str, opened: Opened) -> None:
    """Record a result (a failure to write costs only the next open's time)."""
    shards = set(opened.paths) | {shard for shard, _, _ in opened.skipped}  # a shard all of whose samples are skipped
    files = sorted(shards | set(opened.index_paths))
    try:
        data = {"format": FORMAT, "paths": opened.paths, "index_paths": opened.index_paths, "sizes": opened.sizes,
                "skipped": opened.skipped, "converted": opened.converted, "raw_bytes": opened.raw_bytes,
                "files": [(p, _identity(p, p in shards)) for p in files]}
        write_atomic(cache_dir / "opened" / f"{name}.json", json.dumps(data))
    except OSError as exc:
        warnings.warn(f"cannot record the opened dataset in {cache_dir / 'opened'} ({exc}); the next open "
                      "reads every index again", stacklevel=3)
