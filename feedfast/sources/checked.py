"""Per-shard image checks, cached, and the side shards holding re-encoded samples."""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from feedfast.errors import ShardError
from feedfast.sources.checkworker import Failed, pool
from feedfast.sources.index import Sample, first_member, load_index, read_index, shard_digest, write_atomic
from feedfast.sources.validate import SNIFF_BYTES, Verdict


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
              cache: Path, decode: bool, seconds: float) -> dict[str, dict[str, str]]:
    """{"bad": {key: reason}, "convert": {key: reason}}, from the cache when fresh (for this time limit)."""
    tag = shard_digest(path, max_pixels, sorted(map(sorted, image_exts)), decode, [s.key for s in samples], CHECK_RULES,
                       seconds)
    cached = cache / "checks" / f"{Path(path).stem}-{tag}.json"
    if cached.is_file():
        return json.loads(cached.read_text(encoding="utf-8"))
    result: dict[str, dict[str, str]] = {"bad": {}, "convert": {}}
    for key, name, v in check_members(path, samples, image_exts, max_pixels, decode, seconds=seconds):
        if v.status != "ok":
            result[v.status].setdefault(key, f"{name}: {v.reason}")
    for key in result["bad"]:
        result["convert"].pop(key, None)  # a sample with one bad image is left out whole
    write_atomic(cached, json.dumps(result))
    return result


CHECK_RULES = 2  # bump when what a verdict means changes: cached verdicts of older rules are not reused


def check_members(path: str, samples: list[Sample], image_exts: list[set[str]], max_pixels: int,
                  decode: bool, *, seconds: float | None = None) -> Iterator[tuple[str, str, Verdict]]:
    """(key, member name, verdict) of every image component, checked in worker processes, each under
    ``seconds`` (default: the pool's, ``source.check_seconds``'s default)."""
    where = [(s.key, off, size, name) for s in samples for off, size, name in image_members(s, image_exts)]
    verdicts = _run_checks(path, where, max_pixels, decode, seconds)
    again = [w for w, v in zip(where, verdicts) if v.status == "more"]  # header only, and DALI must decide
    full = iter(_run_checks(path, again, max_pixels, True, seconds)) if again else iter(())
    for (key, _, _, name), v in zip(where, verdicts):
        yield key, name, next(full) if v.status == "more" else v


def _run_checks(path: str, where: list[tuple[str, int, int, str]], max_pixels: int, decode: bool,
                seconds: float | None) -> list[Verdict]:
    def jobs() -> Iterator[tuple[object, ...]]:
        with open_shard(path) as f:
            for _, off, size, _ in where:
                cut = size if decode else min(size, SNIFF_BYTES)
                yield ("check", read_member(f, off, cut), max_pixels, decode, cut == size)

    labels = (f"{path!r}, sample {key!r} ({name})" for key, _, _, name in where)
    answers = pool().map(jobs(), labels=labels, seconds=seconds)
    return [Verdict("bad", a.reason) if isinstance(a, Failed) else a for a in answers]


def check_shard(path: str, samples: list[Sample], image_exts: list[set[str]], *,
                max_pixels: int, cache: Path, decode: bool = True, seconds: float | None = None) -> ShardCheck:
    """Check a shard's image components; write a side shard of re-encoded images when needed.

    With ``decode=False`` only headers are read (see :mod:`feedfast.sources.validate`).
    ``seconds`` limits each image's check and re-encoding (the spec's ``source.check_seconds``;
    default: its default); a check that runs longer makes the image ``bad``.
    An image that cannot be re-encoded after all (a header looked fine) is ``bad``. The
    caller gives DALI an index of ``ShardCheck.kept``.
    """
    seconds = pool().seconds if seconds is None else seconds
    v = _verdicts(path, samples, image_exts, max_pixels, cache, decode, seconds)
    bad, convert = dict(v["bad"]), dict(v["convert"])
    if not bad and not convert:
        return ShardCheck(samples)
    moved = [s for s in samples if s.key in convert]
    side = None
    if moved:
        side, failed = _side_shard(path, moved, image_exts, cache, max_pixels, seconds)
        for key, reason in failed.items():
            bad[key] = reason
            convert.pop(key)
    kept = [s for s in samples if s.key not in bad and s.key not in convert]
    check = ShardCheck(kept, bad, convert)
    if side is not None:
        idx, side_samples = load_index(side, cache)
        check.side_shard, check.side_index, check.side_count = str(side), str(idx), len(side_samples)
    return check


def _side_shard(path: str, moved: list[Sample], image_exts: list[set[str]], cache: Path,
                max_pixels: int, seconds: float) -> tuple[Path | None, dict[str, str]]:
    """The side shard of re-encoded samples (written once) and {key: reason} of those that could not be."""
    tag = shard_digest(path, max_pixels, sorted(s.key for s in moved), CHECK_RULES, seconds)
    side = cache / "converted" / f"{Path(path).stem}-{tag}.tar"
    failed_file = side.with_name(side.name + ".failed.json")
    if failed_file.is_file():
        failed: dict[str, str] = json.loads(failed_file.read_text(encoding="utf-8"))
        return (side if side.is_file() else None), failed
    failed = _write_side_shard(path, side, moved, image_exts, seconds)
    write_atomic(failed_file, json.dumps(failed))
    return (side if side.is_file() else None), failed


def _write_side_shard(src: str, out: Path, samples: list[Sample], image_exts: list[set[str]],
                      seconds: float) -> dict[str, str]:
    """Write the samples with their images as PNG (names keep their extension: DALI sniffs the format).

    Returns {key: reason} of the samples left out because an image could not be re-encoded.
    """
    images = [(s, m) for s in samples for m in s.members
              if m.name in {name for _, _, name in image_members(s, image_exts)}]
    with open_shard(src) as f:
        jobs = (("png", read_member(f, m.offset, m.size)) for _, m in images)
        labels = (f"{src!r}, sample {s.key!r} ({m.name})" for s, m in images)
        pngs: dict[str, bytes] = {}
        failed: dict[str, str] = {}
        for (s, m), answer in zip(images, pool().map(jobs, labels=labels, seconds=seconds)):
            if isinstance(answer, (Failed, str)):
                failed.setdefault(s.key, f"{m.name}: {getattr(answer, 'reason', answer)}")
            else:
                pngs[m.name] = answer
    done = [s for s in samples if s.key not in failed]
    if not done:
        return failed
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    with open_shard(src) as f, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for s in done:
            for m in s.members:
                data = pngs[m.name] if m.name in pngs else read_member(f, m.offset, m.size)
                info = tarfile.TarInfo(m.name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return failed


def find_bad_image(paths: list[str], index_paths: list[str], image_exts: list[set[str]],
                   max_pixels: int, *, limit: int | None = None) -> tuple[str, str, str] | None:
    """The first image DALI could not decode in these shards, as (shard, key, reason).

    Used after DALI failed a batch under ``on_error: raise`` without naming the sample:
    each image is decoded by PIL and by DALI's CPU decoder (in the check workers); the
    first that is not ``ok`` (bad, or readable only by PIL) is the one. At most ``limit``
    samples are checked (None: all).
    """
    left = limit
    for path, idx in zip(paths, index_paths):
        samples = read_index(idx, path)
        if left is not None:
            samples, left = samples[:left], left - min(left, len(samples))
        for key, name, v in check_members(path, samples, image_exts, max_pixels, True):
            if v.status != "ok":
                return path, key, f"{name}: {v.reason}"
        if left == 0:
            break
    return None


def image_reason(path: str, index_path: str, key: str, image_exts: list[set[str]], max_pixels: int) -> str | None:
    """Why the sample ``key`` of a shard is not ``ok`` for both decoders (None: it is, or it is not listed)."""
    samples = [s for s in read_index(index_path, path) if s.key == key]
    for _, name, v in check_members(path, samples, image_exts, max_pixels, True):
        if v.status != "ok":
            return f"{name}: {v.reason}"
    return None
