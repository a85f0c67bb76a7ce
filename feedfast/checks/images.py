"""The verdicts of many images, checked in the check pool (:mod:`feedfast.checks.worker`), in batches.

Header checks (``decode=False``, what ``on_error: raise`` asks) go up to :data:`BATCH_IMAGES`
images (and :data:`BATCH_BYTES` of data) to a message: one image a message cost more in pipes,
pickles and wake-ups than the check itself (about 50 us). A batch runs under the per-image
time limit as a whole. A batch that runs over it, whose worker crashes, or during which a
decoder printed an error line (which the verdict of one image would carry) is checked
again one image a message, so every verdict and reason is the one the image gets alone,
and a hostile image costs at most twice the limit. Full decodes (``decode=True``) go one
image a message, as each may take up to the limit. A progressive JPEG larger than its sniffed
bytes is asked again with the whole file (its scans are counted: one of many scans is
decoded under the limit, see :data:`~feedfast.checks.decoders.PLAIN_SCANS`).

The images of several shards go through one stream of messages, so the workers stay busy
across shard boundaries; :func:`run_checks` takes the shards lazily, so that what makes the
next one runs while the workers check the ones before.
"""

from __future__ import annotations

import io
import itertools
import mmap
import os
from typing import Iterable, Iterator, Sequence

from feedfast.checks.decoders import Verdicts
from feedfast.checks.validate import SNIFF_BYTES, Verdict
from feedfast.checks.worker import Failed, pool
from feedfast.errors import ShardError

BATCH_IMAGES = 256
BATCH_BYTES = 4 << 20
Where = tuple[str, int, int, str]  # an image component: (sample key, data offset, size, member name)


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


def run_checks(shards: Iterable[tuple[str, Sequence[Where]]], max_pixels: int, decode: bool,
               seconds: float | None) -> list[list[Verdict]]:
    """The verdict on every image of every shard, in order, each under ``seconds`` (None: the pool's).

    ``shards`` is read lazily, as the workers need more images: whatever makes the next shard
    (reading its index, dropping incomplete samples) runs while they check the ones before.
    """
    if decode:
        return _one_by_one(list(shards), max_pixels, True, seconds)
    taken: list[tuple[str, Sequence[Where]]] = []
    batches: list[tuple[int, Sequence[Where]]] = []
    jobs = _batch_jobs(shards, taken, batches, max_pixels)
    first = next(jobs, None)
    if first is None:  # no image at all: no worker is started
        return [[] for _ in taken]
    labels = (f"{taken[n][0]!r}, samples {part[0][0]!r} to {part[-1][0]!r} ({len(part)} images)"
              for n, part in _growing(batches))
    answers = list(pool().map(itertools.chain([first], jobs), labels=labels, seconds=seconds))  # whole, before
    verdicts: list[list[Verdict]] = [[] for _ in taken]  # any retry asks the pool again
    retry = [(taken[n][0], part) for (n, part), a in zip(batches, answers) if not isinstance(a, Verdicts) or a.noisy]
    again = iter(_one_by_one(retry, max_pixels, False, seconds))
    for (n, _), answer in zip(batches, answers):
        if isinstance(answer, Verdicts) and not answer.noisy:
            verdicts[n] += answer.items
        else:  # ran over its time, crashed, or printed: image by image, as each would be alone
            verdicts[n] += next(again)
    return _whole(taken, verdicts, max_pixels, seconds)


def _whole(shards: Sequence[tuple[str, Sequence[Where]]], verdicts: list[list[Verdict]], max_pixels: int,
           seconds: float | None) -> list[list[Verdict]]:
    """The verdicts, those that asked for the ``whole`` file (a progressive JPEG) checked again with it."""
    wanted = [(path, [w for w, v in zip(where, found) if v.status == "whole"])
              for (path, where), found in zip(shards, verdicts)]
    if not any(where for _, where in wanted):
        return verdicts
    redone = iter(_one_by_one(wanted, max_pixels, False, seconds, whole=True))
    out = []
    for found in verdicts:
        second = iter(next(redone))
        out.append([next(second) if v.status == "whole" else v for v in found])
    return out


def _growing(items: list[tuple[int, Sequence[Where]]]) -> Iterator[tuple[int, Sequence[Where]]]:
    """The items of a list that grows as it is read (a batch is listed just before its job is made)."""
    for i in itertools.count():
        if i >= len(items):
            return
        yield items[i]


def _cuts(where: Sequence[Where]) -> Iterator[tuple[int, int]]:
    """(start, end) of consecutive batches: at most BATCH_IMAGES images and BATCH_BYTES of sniffed data."""
    start, held = 0, 0
    for i, (_, _, size, _) in enumerate(where):
        cut = min(size, SNIFF_BYTES)
        if i > start and (i - start == BATCH_IMAGES or held + cut > BATCH_BYTES):
            yield start, i
            start, held = i, 0
        held += cut
    if start < len(where):
        yield start, len(where)


def _batch_jobs(shards: Iterable[tuple[str, Sequence[Where]]], taken: list[tuple[str, Sequence[Where]]],
                batches: list[tuple[int, Sequence[Where]]], max_pixels: int) -> Iterator[tuple[object, ...]]:
    """One ``checks`` job per batch: the images' first SNIFF_BYTES (sliced from the mapped shard), and
    whether that is the whole file. Each shard read is added to ``taken``, each batch to ``batches``."""
    opened: tuple[int, io.BufferedReader, mmap.mmap | bytes] | None = None
    try:
        for path, where in shards:
            taken.append((path, where))
            for start, end in _cuts(where):
                n, part = len(taken) - 1, where[start:end]
                if opened is None or opened[0] != n:
                    _close(opened)
                    f = open_shard(path)
                    length = os.fstat(f.fileno()).st_size
                    opened = (n, f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if length else b"")
                view = opened[2]
                batches.append((n, part))
                yield ("checks", [view[off:off + min(size, SNIFF_BYTES)] for _, off, size, _ in part], max_pixels,
                       False, [size <= SNIFF_BYTES for _, _, size, _ in part])
    finally:
        _close(opened)


def _close(opened: tuple[int, io.BufferedReader, mmap.mmap | bytes] | None) -> None:
    if opened is not None:
        if isinstance(opened[2], mmap.mmap):
            opened[2].close()
        opened[1].close()


def _one_by_one(shards: Sequence[tuple[str, Sequence[Where]]], max_pixels: int, decode: bool,
                seconds: float | None, *, whole: bool = False) -> list[list[Verdict]]:
    """The verdicts with one image a message (full decodes, batches asked again, and with ``whole`` the
    header checks that need the whole file)."""
    def jobs() -> Iterator[tuple[object, ...]]:
        for path, where in shards:
            with open_shard(path) as f:
                for _, off, size, _ in where:
                    cut = size if decode or whole else min(size, SNIFF_BYTES)
                    yield ("check", read_member(f, off, cut), max_pixels, decode, cut == size)

    if not any(where for _, where in shards):
        return [[] for _ in shards]
    labels = (f"{path!r}, sample {key!r} ({name})" for path, where in shards for key, _, _, name in where)
    answers = pool().map(jobs(), labels=labels, seconds=seconds)
    flat = [Verdict("bad", a.reason) if isinstance(a, Failed) else a for a in answers]
    out, at = [], 0
    for _, where in shards:
        out.append(flat[at:at + len(where)])
        at += len(where)
    return out
