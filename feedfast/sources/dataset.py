"""A dataset of local shards: resolved paths, indexes and per-shard sample counts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from feedfast.errors import SampleError
from feedfast.sources.index import Sample, load_index
from feedfast.sources.shardlist import resolve_shards
from feedfast.spec.model import Spec


@dataclass(frozen=True)
class ShardSet:
    """Local shards with their indexes, and the samples each one contributes.

    Attributes:
        paths: shard paths in the given order.
        index_paths: the matching DALI index files.
        sizes: usable samples per shard (after the missing-component policy).
        missing: samples left out by ``missing: skip``, as (shard, key, reason).
    """

    paths: tuple[str, ...]
    index_paths: tuple[str, ...]
    sizes: tuple[int, ...]
    missing: tuple[tuple[str, str, str], ...] = ()

    @property
    def total(self) -> int:
        """Usable samples over all shards."""
        return sum(self.sizes)

    @property
    def bytes(self) -> int:
        """Total size of the shard files."""
        return sum(os.path.getsize(p) for p in self.paths)


def _has(sample: Sample, exts: str) -> bool:
    wanted = set(exts.lower().split(";"))
    return any(e.lower() in wanted for e in sample.exts)


def open_shards(shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], spec: Spec,
                cache_dir: Path) -> ShardSet:
    """Resolve, index and count shards for a spec.

    Samples lacking a component are an error naming the shard and key under
    ``missing: error``, are left out and listed under ``missing: skip``, and count under
    ``missing: empty`` (the component arrives empty).
    """
    paths = resolve_shards(shards)
    index_paths, sizes, missing = [], [], []
    for p in paths:
        idx, samples = load_index(p, cache_dir)
        index_paths.append(str(idx))
        usable = 0
        for s in samples:
            lacking = [c.name for c in spec.components.values() if not _has(s, c.ext)]
            if not lacking or spec.missing == "empty":
                usable += 1
            elif spec.missing == "skip":
                missing.append((p, s.key, f"missing component(s) {', '.join(lacking)}"))
            else:
                raise SampleError("sample lacks a component (source.missing is `error`)", shard=p, key=s.key,
                                  reason=f"no member for {', '.join(lacking)}; has {', '.join(s.exts) or 'nothing'}; "
                                  "set `source: {missing: skip}` to leave such samples out")
        sizes.append(usable)
    return ShardSet(tuple(paths), tuple(index_paths), tuple(sizes), tuple(missing))
