"""Mixing datasets by weight: each epoch draws a fixed number of samples from every source.

``Mix({"web/*.tar": 0.7, "curated/*.tar": 0.3})`` makes an epoch of ``epoch_size`` samples
(default: all sources' samples together) of which source ``i`` contributes
``round(epoch_size * w_i / sum(w))`` (largest remainders, so the counts add up exactly).
Each source is read as an endless stream of its own reshuffled passes (a new permutation
per pass, fixed by the seed), and epoch ``e`` takes the next slice of that stream: a source
drawn below its size has every sample seen once before any repeats, and one drawn above its
size repeats samples as evenly as possible. An epoch that straddles two passes of a source
can hold a sample from the end of one pass and again from the start of the next. The drawn samples are written as per-epoch DALI
indexes (repeats are plain repeated entries), so the reader, the exact split over ranks,
padding and resume work as for any dataset. Only local shards can be mixed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feedfast.errors import UserError
from feedfast.shards.index.tarindex import read_index, subset_index
from feedfast.sources.dataset import ShardSet, open_shards
from feedfast.sources.folder import FolderSet, is_folder_source, open_folder

Dataset = ShardSet | FolderSet
"""What an epoch reads: shards, or images in place (each answers what the loader asks of a dataset)."""


@dataclass(frozen=True)
class Mix:
    """Sources of shards and their weights; pass as ``feedfast.DataLoader(..., shards=Mix(...))``.

    Args:
        sources: ``{shards: weight}`` or a list of ``(shards, weight)``; ``shards`` is anything
            ``DataLoader(shards=...)`` takes for one dataset.
        epoch_size: samples per epoch over all sources (default: their total).
    """

    sources: tuple[tuple[Any, float], ...]
    epoch_size: int | None = None

    def __init__(self, sources: Mapping[Any, float] | Sequence[tuple[Any, float]], *, epoch_size: int | None = None):
        pairs = tuple(sources.items()) if isinstance(sources, Mapping) else tuple(tuple(p) for p in sources)
        if not pairs:
            raise UserError("Mix needs at least one source")
        for shards, w in pairs:
            if not isinstance(w, (int, float)) or isinstance(w, bool) or not w > 0:
                raise UserError(f"Mix weight of {shards!r} must be a number > 0, got {w!r}")
        if epoch_size is not None and (not isinstance(epoch_size, int) or epoch_size < 1):
            raise UserError(f"Mix epoch_size must be an integer >= 1, got {epoch_size!r}")
        object.__setattr__(self, "sources", tuple((s, float(w)) for s, w in pairs))
        object.__setattr__(self, "epoch_size", epoch_size)


def source_counts(total: int, weights: Sequence[float]) -> list[int]:
    """Samples per source for an epoch of ``total``: proportional, summing exactly to ``total``.

    >>> source_counts(10, [0.7, 0.3])
    [7, 3]
    """
    norm = sum(weights)
    exact = [total * w / norm for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def draw(size: int, count: int, *, seed: int, epoch: int, source: int) -> list[int]:
    """Positions ``[epoch * count, (epoch + 1) * count)`` of a source's endless reshuffled stream."""
    out: list[int] = []
    start = epoch * count
    while len(out) < count:
        cycle, offset = divmod(start + len(out), size)
        perm = list(range(size))
        random.Random(f"feedfast-mix/{seed}/{source}/{cycle}").shuffle(perm)
        out.extend(perm[offset: offset + count - len(out)])
    return out


def mixed_epoch(sets: Sequence[ShardSet], mix: Mix, *, seed: int, epoch: int, cache_dir: Path) -> ShardSet:
    """The epoch's dataset: per-epoch indexes over the sources' shards, with the drawn samples."""
    total = mix.epoch_size or sum(s.total for s in sets)
    counts = source_counts(total, [w for _, w in mix.sources])
    paths: list[str] = []
    idxs: list[str] = []
    sizes: list[int] = []
    for i, (shards, count) in enumerate(zip(sets, counts)):
        if count == 0:
            continue
        if shards.total == 0:
            raise UserError(f"Mix source {mix.sources[i][0]!r} has no usable samples")
        samples = [(k, s) for k, idx in enumerate(shards.index_paths)
                   for s in read_index(idx, shards.paths[k], shards.sizes[k])]
        chosen: dict[int, list[Any]] = {}
        for pos in draw(len(samples), count, seed=seed, epoch=epoch, source=i):
            k, s = samples[pos]
            chosen.setdefault(k, []).append(s)
        for k, picked in sorted(chosen.items()):
            paths.append(shards.paths[k])
            idxs.append(subset_index(shards.paths[k], picked, cache_dir, "mix"))
            sizes.append(len(picked))
    return ShardSet(tuple(paths), tuple(idxs), tuple(sizes),
                    skipped=tuple(x for s in sets for x in s.skipped),
                    converted=tuple(x for s in sets for x in s.converted),
                    raw_bytes=sum(s.raw_bytes for s in sets), cache_dir=str(cache_dir))


def open_dataset(shards: Any, spec: Any, cache_dir: Path, **open_kw: Any
                 ) -> tuple[tuple[Mix, list[ShardSet]] | None, ShardSet | FolderSet | None]:
    """Open what ``DataLoader(shards=...)`` was given: one dataset (shards, or images in place: a folder or a file
    list, :mod:`.folder`), or each source of a Mix.

    Returns ``(None, dataset)`` for one dataset and ``((mix, shard sets), None)`` for a Mix.
    """
    if not isinstance(shards, Mix):
        if is_folder_source(shards):
            return None, open_folder(shards, spec, cache_dir, **open_kw)
        return None, open_shards(shards, spec, cache_dir, **open_kw)
    folders = [s for s, _ in shards.sources if is_folder_source(s)]
    if folders:
        raise UserError(f"Mix combines shards only, and {folders[0]!r} is images read in place: write it as shards "
                        "(`feedfast shards make`) to mix it")
    sets = [open_shards(s, spec, cache_dir, **open_kw) for s, _ in shards.sources]
    if any(k != "file" for s in sets for k in s.read_kinds):
        raise UserError("Mix combines local shards only; copy remote shards locally (or mount them) to mix")
    return (shards, sets), None
