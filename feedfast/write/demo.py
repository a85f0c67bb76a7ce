"""Synthetic datasets made once in feedfast's cache folder, indexed, for demos and benchmarks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from feedfast import _env
from feedfast.shards.index.tarindex import load_index
from feedfast.write.synth import synth_shards


def synth_dataset(*, samples: int, per_shard: int, seed: int = 0, min_side: int = 300, max_side: int = 500,
                  num_classes: int = 1000, cache_dir: str | os.PathLike[str] | None = None,
                  announce: Callable[[Path], None] | None = None) -> list[str]:
    """Shard paths of a synthetic photo-like dataset, written and indexed on first use.

    The set lives in ``cache_dir`` (default: feedfast's cache folder) under a name made of
    its parameters, and is reused while its ``COMPLETE`` marker is there.

    Args:
        samples, per_shard, seed, min_side, max_side, num_classes: as for
            :func:`feedfast.write.synth.synth_shards`.
        cache_dir: where the set and its indexes go.
        announce: called with the set's folder before the set is generated (to say so).
    """
    cache = Path(cache_dir) if cache_dir else _env.cache_dir()
    out = cache / f"synth-{samples}-{per_shard}-{seed}-{min_side}-{max_side}-{num_classes}"
    count = -(-samples // per_shard)
    paths = [out / f"train-{i:04d}.tar" for i in range(count)]
    if not (out / "COMPLETE").exists():
        if announce:
            announce(out)
        paths = synth_shards(out, samples=samples, per_shard=per_shard, seed=seed, min_side=min_side,
                             max_side=max_side, num_classes=num_classes)
        for p in paths:
            load_index(p, cache)
        (out / "COMPLETE").write_text("ok\n", encoding="utf-8")
    return [str(p) for p in paths]


def shard_pattern(paths: list[str]) -> str:
    """The brace pattern of :func:`synth_dataset`'s shards (``.../train-{0000..0007}.tar``)."""
    return str(Path(paths[0]).parent / f"train-{{0000..{len(paths) - 1:04d}}}.tar")
