"""Shared test helpers: tiny shards and specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from feedfast.sources.synth import synth_shards

SMALL_SPEC: dict[str, Any] = {
    "version": 1,
    "name": "small-train",
    "pipeline": {
        "image": ["decode", {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5}}, "normalize"],
        "label": ["label"],
    },
    "outputs": ["image", "label"],
    "batch": {"size": 4},
    "seed": 3,
}


def make_shards(out: Path, *, samples: int, per_shard: int, seed: int = 1) -> list[str]:
    """Small real JPEG shards (64 to 96 px), labels in 0..9."""
    paths = synth_shards(out, samples=samples, per_shard=per_shard, seed=seed, min_side=64, max_side=96,
                         num_classes=10)
    return [str(p) for p in paths]


def keys_of_epoch(loader: Any) -> list[str]:
    """The real (non-padded) sample keys one epoch of ``loader`` yields."""
    keys: list[str] = []
    for _ in loader:
        keys += [k for _, k in loader.last_origins[: loader.last_valid]]
    return keys
