"""Per-shard image checks, cached, and the side shards holding re-encoded samples."""

from __future__ import annotations

import io
import itertools
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from feedfast.checks.images import open_shard, read_member, run_checks
from feedfast.checks.validate import Verdict
from feedfast.checks.worker import Failed, pool
from feedfast.shards.index.tarindex import Sample, first_member, load_index, shard_digest, write_atomic

__all__ = ["CHECK_RULES", "ShardCheck", "check_members", "check_shard", "check_shards", "image_members",
           "open_shard", "read_member"]


@dataclass
class ShardCheck:
    """The outcome of checking one shard: the samples DALI reads from it, those left out, those re-encoded."""

    kept: list[Sample]
    bad: dict[str, str] = field(default_factory=dict)
    converted: dict[str, str] = field(default_factory=dict)
    side_shard: str | None = None
    side_index: str | None = None
    side_count: int = 0


def image_members(sample: Sample, image_exts: list[set[str]]) -> list[tuple[int, int, str]]:
    """(offset, size, name) of the sample's image components (the first match of each)."""
    found = (first_member(sample, exts) for exts in image_exts)
    return [(m.offset, m.size, m.name) for m in found if m is not None]


# bump when what a verdict means changes: cached verdicts of older rules are not reused
# (3: an image only DALI's decoder reads is "convert", not "bad"; a progressive JPEG's scans are counted)
CHECK_RULES = 3
SHARDS_AT_ONCE = 16  # check_shards checks this many shards' images in one stream of messages


def check_members(path: str, samples: list[Sample], image_exts: list[set[str]], max_pixels: int,
                  decode: bool, *, seconds: float | None = None) -> Iterator[tuple[str, str, Verdict]]:
    """(key, member name, verdict) of every image component, checked in worker processes, each under
    ``seconds`` (default: the pool's, ``source.check_seconds``'s default)."""
    yield from _members([(path, samples)], image_exts, max_pixels, decode, seconds)[0][1]


def _members(shards: Iterable[tuple[str, list[Sample]]], image_exts: list[set[str]], max_pixels: int, decode: bool,
             seconds: float | None) -> list[tuple[str, list[tuple[str, str, Verdict]]]]:
    """(path, check_members) of several shards, taken lazily, their images in one stream of messages."""
    taken: list[tuple[str, list[tuple[str, int, int, str]]]] = []

    def wheres() -> Iterator[tuple[str, list[tuple[str, int, int, str]]]]:
        for path, samples in shards:
            taken.append((path, [(s.key, off, size, name) for s in samples
                                 for off, size, name in image_members(s, image_exts)]))
            yield taken[-1]

    first = run_checks(wheres(), max_pixels, decode, seconds)
    # header only, and DALI must decide: the whole file, one image a message
    again = [(path, [w for w, v in zip(where, verdicts) if v.status == "more"])
             for (path, where), verdicts in zip(taken, first)]
    full = run_checks(again, max_pixels, True, seconds) if any(w for _, w in again) else [[] for _ in taken]
    out = []
    for (path, where), verdicts, redone in zip(taken, first, full):
        second = iter(redone)
        out.append((path, [(key, name, next(second) if v.status == "more" else v)
                           for (key, _, _, name), v in zip(where, verdicts)]))
    return out


def _verdicts(shards: Iterable[tuple[str, list[Sample]]], image_exts: list[set[str]], max_pixels: int,
              cache: Path, decode: bool, seconds: float) -> list[tuple[str, list[Sample], dict[str, dict[str, str]]]]:
    """(path, samples, {"bad": {key: reason}, "convert": {key: reason}}) of each shard, taken lazily: from
    the cache when fresh (for this time limit), else checked, those not cached together."""
    taken: list[tuple[str, list[Sample], Path, dict[str, dict[str, str]] | None]] = []

    def uncached() -> Iterator[tuple[str, list[Sample]]]:
        for path, samples in shards:
            tag = shard_digest(path, max_pixels, sorted(map(sorted, image_exts)), decode, [s.key for s in samples],
                               CHECK_RULES, seconds)
            file = cache / "checks" / f"{Path(path).stem}-{tag}.json"
            found = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None
            taken.append((path, samples, file, found))
            yield path, ([] if found is not None else samples)

    checked = _members(uncached(), image_exts, max_pixels, decode, seconds)
    out = []
    for (path, samples, file, found), (_, members) in zip(taken, checked):
        if found is None:
            found = {"bad": {}, "convert": {}}
            for key, name, v in members:
                if v.status != "ok":
                    found[v.status].setdefault(key, f"{name}: {v.reason}")
            for key in found["bad"]:
                found["convert"].pop(key, None)  # a sample with one bad image is left out whole
            write_atomic(file, json.dumps(found))
        out.append((path, samples, found))
    return out


def check_shard(path: str, samples: list[Sample], image_exts: list[set[str]], *,
                max_pixels: int, cache: Path, decode: bool = True, seconds: float | None = None) -> ShardCheck:
    """Check a shard's image components; write a side shard of re-encoded images when needed.

    With ``decode=False`` only headers are read (see :mod:`feedfast.checks.validate`), in
    batches (:mod:`feedfast.checks.images`). ``seconds`` limits each image's check and
    re-encoding (the spec's ``source.check_seconds``; default: its default); a check that
    runs longer makes the image ``bad``. An image that cannot be re-encoded after all (a
    header looked fine) is ``bad``. The caller gives DALI an index of ``ShardCheck.kept``.
    """
    (check,) = check_shards([(path, samples)], image_exts, max_pixels=max_pixels, cache=cache, decode=decode,
                            seconds=seconds)
    return check


def check_shards(shards: Iterable[tuple[str, list[Sample]]], image_exts: list[set[str]], *, max_pixels: int,
                 cache: Path, decode: bool = True, seconds: float | None = None) -> Iterator[ShardCheck]:
    """:func:`check_shard` of each (shard, samples), in order, as each is done.

    ``shards`` is read lazily, :data:`SHARDS_AT_ONCE` at a time, as the check workers need more
    images: give a generator that opens each shard (indexes it, drops its incomplete samples)
    and that work runs while the workers check the shards before it; their images go to the
    workers in one stream, so they stay busy across shard boundaries.
    """
    seconds = pool().seconds if seconds is None else seconds
    pending = iter(shards)
    while True:
        done = _verdicts(itertools.islice(pending, SHARDS_AT_ONCE), image_exts, max_pixels, cache, decode, seconds)
        if not done:
            return
        for path, samples, found in done:
            yield _outcome(path, samples, found, image_exts, cache, max_pixels, seconds)


def _outcome(path: str, samples: list[Sample], verdicts: dict[str, dict[str, str]], image_exts: list[set[str]],
             cache: Path, max_pixels: int, seconds: float) -> ShardCheck:
    """A shard's check from its verdicts: the samples kept, and the side shard of those re-encoded."""
    bad, convert = dict(verdicts["bad"]), dict(verdicts["convert"])
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
