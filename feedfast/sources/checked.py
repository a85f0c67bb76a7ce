"""Per-shard image checks, cached, and the side shards holding re-encoded samples."""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from feedfast.errors import ShardError
from feedfast.sources.index import Sample, first_member, load_index, read_index, shard_digest, write_atomic
from feedfast.sources.validate import SNIFF_BYTES, probe_image, to_png


@dataclass
class ShardCheck:
    """The outcome of checking one shard: the samples DALI reads from it, those left out, those re-encoded."""

    kept: list[Sample]
    bad: dict[str, str] = field(default_factory=dict)
    converted: dict[str, str] = field(default_factory=dict)
    side_shard: str | None = None
    side_index: str | None = None
    side_count: int = 0


def open_shard(path: str) -> io.BufferedReader:
    """Open a shard for reading members; OS errors become a ShardError naming it."""
    try:
        return open(path, "rb")
    except FileNotFoundError as exc:
        raise ShardError(f"shard not found: {path!r}") from exc
    except OSError as exc:
        raise ShardError(f"shard not readable: {path!r} ({exc.strerror})") from exc


def read_member(f: io.BufferedReader, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` of an open tar."""
    f.seek(offset)
    return f.read(size)


def image_members(sample: Sample, image_exts: list[set[str]]) -> list[tuple[int, int, str]]:
    """(offset, size, name) of the sample's image components (the first match of each)."""
    found = (first_member(sample, exts) for exts in image_exts)
    return [(m.offset, m.size, m.name) for m in found if m is not None]


def _verdicts(path: str, samples: list[Sample], image_exts: list[set[str]], max_pixels: int,
              cache: Path, decode: bool) -> dict[str, dict[str, str]]:
    """{"bad": {key: reason}, "convert": {key: reason}}, from the cache when fresh."""
    tag = shard_digest(path, max_pixels, sorted(map(sorted, image_exts)), decode, [s.key for s in samples])
    cached = cache / "checks" / f"{Path(path).stem}-{tag}.json"
    if cached.is_file():
        return json.loads(cached.read_text(encoding="utf-8"))
    result: dict[str, dict[str, str]] = {"bad": {}, "convert": {}}
    with open_shard(path) as f:
        for s in samples:
            for off, size, name in image_members(s, image_exts):
                data = read_member(f, off, size if decode else min(size, SNIFF_BYTES))
                v = probe_image(data, max_pixels=max_pixels, decode=decode)
                if v.status != "ok":
                    result[v.status].setdefault(s.key, f"{name}: {v.reason}")
    write_atomic(cached, json.dumps(result))
    return result


def check_shard(path: str, samples: list[Sample], image_exts: list[set[str]], *,
                max_pixels: int, cache: Path, decode: bool = True) -> ShardCheck:
    """Check a shard's image components; write a side shard of re-encoded images when needed.

    With ``decode=False`` only headers are read (see :func:`probe_image`). The caller
    gives DALI an index of ``ShardCheck.kept``.
    """
    v = _verdicts(path, samples, image_exts, max_pixels, cache, decode)
    bad, convert = v["bad"], v["convert"]
    if not bad and not convert:
        return ShardCheck(samples)
    kept = [s for s in samples if s.key not in bad and s.key not in convert]
    check = ShardCheck(kept, dict(bad), dict(convert))
    moved = [s for s in samples if s.key in convert]
    if moved:
        tag = shard_digest(path, max_pixels, sorted(convert))
        side = cache / "converted" / f"{Path(path).stem}-{tag}.tar"
        _write_side_shard(path, side, moved, image_exts)
        idx, side_samples = load_index(side, cache)
        check.side_shard, check.side_index, check.side_count = str(side), str(idx), len(side_samples)
    return check


def _write_side_shard(src: str, out: Path, samples: list[Sample], image_exts: list[set[str]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    images = {name for s in samples for _, _, name in image_members(s, image_exts)}
    with open_shard(src) as f, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for s in samples:
            for m in s.members:
                data = read_member(f, m.offset, m.size)
                if m.name in images:
                    data = to_png(data)  # the name keeps its extension: DALI sniffs the format
                info = tarfile.TarInfo(m.name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)


def find_bad_image(paths: list[str], index_paths: list[str], image_exts: list[set[str]],
                   max_pixels: int) -> tuple[str, str, str] | None:
    """The first image DALI could not decode in these shards, as (shard, key, reason).

    Used after DALI failed a batch under ``on_error: raise`` without naming the sample.
    """
    for path, idx in zip(paths, index_paths):
        samples = read_index(idx, path)
        with open_shard(path) as f:
            for s in samples:
                for off, size, name in image_members(s, image_exts):
                    v = probe_image(read_member(f, off, size), max_pixels=max_pixels)
                    if v.status != "ok":
                        return path, s.key, f"{name}: {v.reason}"
    return None
