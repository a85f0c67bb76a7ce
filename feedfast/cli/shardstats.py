"""What the shards hold: sizes and a sample of image sizes for ``feedfast analyze``, and
the problems ``feedfast shards inspect`` reports.

Images are sampled evenly over shards and within each shard through the shard's index
(so nothing is scanned), and only their headers are parsed for sizes. The sampled bytes
are returned too, for a decode micro-benchmark.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedfast.checks.decoders import open_image
from feedfast.shards.index.tarindex import Member, parse_index


@dataclass(frozen=True)
class ShardStats:
    """Sizes of the shards and of a sample of their images.

    Attributes:
        shards: how many shards.
        total_mb: their total size, MB (10^6 bytes).
        mean_shard_mb: mean shard size, MB.
        images_sampled: images read for the figures below (0: the spec has no image component).
        unreadable: sampled images PIL could not identify (left out of the figures).
        mean_image_kb: mean encoded image size, kB (None without images).
        mean_megapixels: mean decoded size, megapixels.
        mean_short_side: mean shorter side, pixels.
        sizes: (width, height) of each readable sampled image.
    """

    shards: int
    total_mb: float
    mean_shard_mb: float
    images_sampled: int = 0
    unreadable: int = 0
    mean_image_kb: float | None = None
    mean_megapixels: float | None = None
    mean_short_side: float | None = None
    sizes: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-safe figures (without the per-image sizes)."""
        return {k: v for k, v in self.__dict__.items() if k != "sizes"}


def _spread(items: Sequence[Member], count: int) -> list[Member]:
    """Up to ``count`` items evenly spaced over ``items``."""
    if len(items) <= count:
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


def sample_images(paths: Sequence[str], index_paths: Sequence[str], exts: set[str], limit: int) -> list[bytes]:
    """Encoded images, up to about ``limit``, spread over shards and within them."""
    picks = list(range(len(paths))) if len(paths) <= limit else [i * len(paths) // limit for i in range(limit)]
    per_shard = math.ceil(limit / max(len(picks), 1))
    out: list[bytes] = []
    for i in picks:
        with open(index_paths[i], encoding="utf-8") as f:
            samples = parse_index(f.read())
        members = [m for s in samples for m in s.members if m.ext.lower() in exts]
        with open(paths[i], "rb") as shard:
            for m in _spread(members, per_shard):
                shard.seek(m.offset)
                out.append(shard.read(m.size))
    return out[:limit]


def shard_stats(paths: Sequence[str], index_paths: Sequence[str], image_exts: set[str],
                *, limit: int = 32) -> tuple[ShardStats, list[bytes]]:
    """Shard and image size figures, and the sampled images' bytes.

    Args:
        paths: shard files.
        index_paths: their index files (same order).
        image_exts: extensions of the image component (lower case); empty: no images.
        limit: about how many images to sample.
    """

    sizes_b = [os.path.getsize(p) for p in paths]
    total = sum(sizes_b) / 1e6
    base = ShardStats(len(paths), total, total / max(len(paths), 1))
    images = sample_images(paths, index_paths, image_exts, limit) if image_exts else []
    dims, good, unreadable = [], [], 0
    for data in images:
        try:
            with open_image(data) as img:
                dims.append(img.size)
        except Exception:  # noqa: BLE001 - any decoder failure: counted and reported in ShardStats.unreadable
            unreadable += 1
            continue
        good.append(data)
    if not dims:
        return ShardStats(**{**base.__dict__, "images_sampled": len(images), "unreadable": unreadable}), good
    return ShardStats(
        len(paths), total, base.mean_shard_mb, len(images), unreadable,
        mean_image_kb=sum(map(len, good)) / len(good) / 1e3,
        mean_megapixels=sum(w * h for w, h in dims) / len(dims) / 1e6,
        mean_short_side=sum(min(w, h) for w, h in dims) / len(dims), sizes=tuple(dims),
    ), good


@dataclass(frozen=True)
class ShardReport:
    """One shard as ``shards inspect`` sees it: sample and component counts, and problems in words."""

    samples: int
    components: dict[str, int]
    problems: list[str]
    labels: list[int] = field(default_factory=list)  # the integer ``.cls`` labels, in shard order


def inspect_shard(path: str, *, check: bool = False, image_exts: set[str] | frozenset[str] = frozenset(),
                  max_pixels: int | None = None, cache_dir: Path | None = None) -> ShardReport:
    """Count a shard's samples and components, and say what is wrong and what the loader does about it.

    Reports a compressed shard, a damaged tar (cut, truncated, corrupt: what each policy reads
    of it), an index the loader would not trust (short, stale, offsets off their members,
    another content fingerprint: :func:`~feedfast.shards.index.tarindex.checked_index`), zero-byte
    members, differing component counts, keys repeated in the shard (adjacent copies too),
    labels (``.cls``) that are not non-negative integers, and with ``check`` the images
    (extensions in ``image_exts``) that the loader's check would leave out or re-encode.
    ``samples`` counts what the loader reads: the first sample of each repeated key, and of a
    damaged tar what ``on_error: skip`` reads.
    """
    from collections import Counter

    from feedfast.checks.validate import DEFAULT_MAX_PIXELS
    from feedfast.errors import ShardError
    from feedfast.shards.index.tarindex import salvage_tar, split_duplicates

    try:
        scanned = salvage_tar(path, keep_duplicates=True)
    except ShardError as exc:  # compressed, sparse, missing: nothing of it can be read
        return ShardReport(0, {}, [f"{path}: {exc} (the loader refuses it under either on_error)"])
    problems = _damage_problems(path, scanned) + _index_problems(path, cache_dir)
    samples, repeated = split_duplicates(scanned.samples)
    exts = Counter(e for s in samples for e in s.exts)
    counts = Counter(len(s.members) for s in samples)
    problems += [f"{path}: {m.name}: zero-byte member (an image is left out under on_error: skip, an error "
                 "under raise)" for s in samples for m in s.members if m.size == 0]
    if len(counts) > 1:
        problems.append(f"{path}: samples have differing component counts {dict(counts)} (samples lacking a "
                        "component follow the spec's `missing` setting)")
    for s in repeated:
        problems.append(f"{path}: key {s.key!r} repeats an earlier sample of this shard ({', '.join(s.exts)}): "
                        "the loader reads only the first sample of a key (with a warning, counted as skipped)")
    labels: list[int] = []
    problems += _label_problems(path, samples, labels)
    if check and image_exts:
        problems += _image_problems(path, samples, image_exts, max_pixels or DEFAULT_MAX_PIXELS)
    return ShardReport(len(samples), dict(exts), problems, labels)


def _damage_problems(path: str, scanned: Any) -> list[str]:
    """What the loader does with a damaged tar, under each policy."""
    damage = scanned.damage
    if damage is None:
        return []
    lost = f"; sample {scanned.lost[0]!r}, cut by it, is left out" if scanned.lost else ""
    return [f"{path}: {damage.message} (under on_error: skip the {len(scanned.samples)} complete sample(s) before "
            f"the damage are read{lost} and the rest counted as skipped; under raise the loader stops with "
            "this error)"]


def _index_problems(path: str, cache_dir: Path | None) -> list[str]:
    """The indexes of the shard the loader would find and not trust (it indexes the shard again)."""
    from feedfast import _env
    from feedfast.shards.index.tarindex import checked_index, index_candidates

    out = []
    for index in index_candidates(path, cache_dir or _env.cache_dir()):
        if not index.is_file():
            continue
        found = checked_index(path, index)
        if found is None:
            out.append(f"{path}: the index {str(index)!r} is older than the shard (the loader indexes it again)")
        elif isinstance(found, str):
            out.append(f"{path}: the index {str(index)!r} does not describe the shard: {found} (the loader "
                       "indexes the shard again, with a warning)")
    return out


def _label_problems(path: str, samples: list, labels: list[int]) -> list[str]:  # type: ignore[type-arg]
    """Problems with ``.cls`` labels; the integer ones are appended to ``labels``."""
    out = []
    with open(path, "rb") as f:
        for s in samples:
            for m in s.members:
                if m.ext.lower() != "cls":
                    continue
                f.seek(m.offset)
                text = f.read(min(m.size, 64)).decode("ascii", "replace").strip()
                if not text.lstrip("-").isdigit():
                    out.append(f"{path}: {m.name}: label {text[:20]!r} is not an integer (the `label` op fails "
                               "on it: an error naming the sample)")
                else:
                    labels.append(int(text))
                if text.lstrip("-").isdigit() and int(text) < 0:
                    out.append(f"{path}: {m.name}: negative label {int(text)} (delivered as is; "
                               "most losses reject it)")
    return out


def label_mixing(per_shard: Sequence[Sequence[int]]) -> dict[str, Any] | None:
    """How mixed labels are across shards: mean distinct labels per shard against shuffled shards' expectation.

    The expectation, for a shard of ``n`` samples drawn at random from the whole set's label
    frequencies ``p_c``, is ``sum_c 1 - (1 - p_c) ** n``. None when there are no labels or one.
    """
    from collections import Counter

    counts = Counter(label for labels in per_shard for label in labels)
    total = sum(counts.values())
    sized = [labels for labels in per_shard if labels]
    if len(counts) < 2 or not sized:
        return None
    freqs = [c / total for c in counts.values()]
    expected = sum(sum(1 - (1 - p) ** len(labels) for p in freqs) for labels in sized) / len(sized)
    mean = sum(len(set(labels)) for labels in sized) / len(sized)
    return {"labels": len(counts), "mean_distinct": round(mean, 2), "expected_distinct": round(expected, 2),
            "ratio": round(mean / expected, 3)}


def _image_problems(path: str, samples: list, image_exts: set[str] | frozenset[str],  # type: ignore[type-arg]
                    max_pixels: int) -> list[str]:
    from feedfast.checks.checked import check_members

    out = []
    for key, name, v in check_members(path, samples, [set(image_exts)], max_pixels, True):
        if v.status == "bad":
            out.append(f"{path}: sample {key!r}: {name}: {v.reason} (left out under on_error: skip, "
                       "an error under raise)")
        elif v.status == "convert":
            out.append(f"{path}: sample {key!r}: {name}: {v.reason} (delivered through a re-encoded copy)")
    return out
