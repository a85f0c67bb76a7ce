"""A dataset of local shards: resolved paths, indexes and per-shard sample counts."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from feedfast.errors import SampleError
from feedfast.sources.checked import check_shard
from feedfast.sources.index import Sample, format_index, load_index
from feedfast.sources.shardlist import resolve_shards
from feedfast.sources.validate import DEFAULT_MAX_PIXELS
from feedfast.spec.model import Spec


@dataclass(frozen=True)
class ShardSet:
    """Local shards with the indexes DALI reads, and the samples each one contributes.

    Attributes:
        paths: shard paths (a side shard of re-encoded images follows its source shard).
        index_paths: the matching DALI index files (filtered when samples were left out).
        sizes: samples DALI reads from each shard.
        skipped: samples left out, as (shard, key, reason): missing components under
            ``missing: skip``, undecodable images under ``on_error: skip``.
        converted: samples re-encoded into side shards, as (shard, key, reason).
        raw_bytes: total size of the given shard files.
    """

    paths: tuple[str, ...]
    index_paths: tuple[str, ...]
    sizes: tuple[int, ...]
    skipped: tuple[tuple[str, str, str], ...] = ()
    converted: tuple[tuple[str, str, str], ...] = ()
    raw_bytes: int = 0

    @property
    def total(self) -> int:
        """Samples DALI reads over all shards."""
        return sum(self.sizes)

    @property
    def bytes(self) -> int:
        """Total size of the given shard files."""
        return self.raw_bytes


def _exts(ext: str) -> set[str]:
    return {e.lower() for e in ext.split(";")}


def _has(sample: Sample, exts: set[str]) -> bool:
    return any(e.lower() in exts for e in sample.exts)


def _complete(path: str, samples: list[Sample], spec: Spec, skipped: list[tuple[str, str, str]]) -> list[Sample]:
    """The samples that have every component, applying ``missing``."""
    kept = []
    for s in samples:
        lacking = [c.name for c in spec.components.values() if not _has(s, _exts(c.ext))]
        if not lacking or spec.missing == "empty":
            kept.append(s)
        elif spec.missing == "skip":
            skipped.append((path, s.key, f"missing component(s) {', '.join(lacking)}"))
        else:
            raise SampleError("sample lacks a component (source.missing is `error`)", shard=path, key=s.key,
                              reason=f"no member for {', '.join(lacking)}; has {', '.join(s.exts) or 'nothing'}; "
                              "set `source: {missing: skip}` to leave such samples out")
    return kept


def _filtered_index(path: str, kept: list[Sample], cache_dir: Path) -> str:
    st = os.stat(path)
    tag = hashlib.sha1(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{[s.key for s in kept]}".encode())
    out = cache_dir / "filtered" / f"{Path(path).stem}-{tag.hexdigest()[:16]}.idx"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(format_index(kept), encoding="utf-8")
    return str(out)


def open_shards(shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], spec: Spec,
                cache_dir: Path, *, on_error: str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> ShardSet:
    """Resolve, index, check and count shards for a spec.

    Samples lacking a component are an error naming the shard and key under
    ``missing: error``, are left out and listed under ``missing: skip``, and count under
    ``missing: empty`` (the component arrives empty). Image components are checked once
    and the verdicts cached (see :mod:`feedfast.sources.validate`): headers only under
    ``on_error: raise``, a full decode under ``on_error: skip``. DALI is given a
    filtered index whenever samples are left out, so it never reads them.
    """
    policy = on_error or spec.on_error
    image_exts = [_exts(c.ext) for c in spec.components.values() if c.kind == "image"]
    paths, idxs, sizes = [], [], []
    skipped: list[tuple[str, str, str]] = []
    converted: list[tuple[str, str, str]] = []
    given = resolve_shards(shards)
    for p in given:
        idx, samples = load_index(p, cache_dir)
        kept = _complete(p, samples, spec, skipped)
        index_path = str(idx) if len(kept) == len(samples) else _filtered_index(p, kept, cache_dir)
        side = None
        if image_exts and kept:
            check = check_shard(p, index_path, kept, image_exts, max_pixels=max_pixels, cache=cache_dir,
                                decode=policy == "skip")
            if check.bad and policy == "raise":
                key, reason = next(iter(check.bad.items()))
                raise SampleError("image cannot be read (on_error is `raise`)", shard=p, key=key,
                                  reason=f"{reason}; set on_error='skip' to leave such samples out")
            kept, index_path = check.kept, check.index_path
            skipped += [(p, k, r) for k, r in check.bad.items()]
            converted += [(p, k, r) for k, r in check.converted.items()]
            if check.side_shard:
                side = (check.side_shard, check.side_index, check.side_count)
        if kept:
            paths.append(p), idxs.append(index_path), sizes.append(len(kept))
        if side:
            paths.append(side[0]), idxs.append(str(side[1])), sizes.append(side[2])
    raw = sum(os.path.getsize(p) for p in given)
    return ShardSet(tuple(paths), tuple(idxs), tuple(sizes), tuple(skipped), tuple(converted), raw)
