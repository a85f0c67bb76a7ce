"""The global sample order and its deal to ranks: pure functions, and shuffled epochs on class-sorted shards."""

from __future__ import annotations

import io
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import feedfast
from feedfast.order.deal import rank_counts, rank_positions
from feedfast.order.globalorder import epoch_order
from tests.helpers import SMALL_SPEC


def test_the_order_is_a_permutation_fixed_by_seed_and_epoch() -> None:
    a = epoch_order(1000, seed=1, epoch=0, shuffle=True)
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, epoch_order(1000, seed=1, epoch=0, shuffle=True))
    assert not np.array_equal(a, epoch_order(1000, seed=1, epoch=1, shuffle=True))
    assert not np.array_equal(a, epoch_order(1000, seed=2, epoch=0, shuffle=True))
    assert epoch_order(5, seed=1, epoch=0, shuffle=False).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("total", "world", "batch"), [(10, 2, 2), (23, 3, 4), (7, 1, 2), (5, 4, 3), (64, 4, 4)])
def test_ranks_split_every_position_once_in_global_batches(total: int, world: int, batch: int) -> None:
    parts = [rank_positions(total, rank=r, world=world, batch_size=batch) for r in range(world)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(total))
    assert [len(p) for p in parts] == rank_counts(total, world=world, batch_size=batch)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    full = total // (world * batch)
    for s in range(full):  # global step s is the s-th run of world*batch positions
        step = sorted(np.concatenate([p[s * batch:(s + 1) * batch] for p in parts]).tolist())
        assert step == list(range(s * world * batch, (s + 1) * world * batch))


def test_the_docstring_example() -> None:
    assert [rank_positions(10, rank=r, world=2, batch_size=2).tolist() for r in range(2)] == [[0, 1, 4, 5, 8],
                                                                                                [2, 3, 6, 7, 9]]


def _class_sorted_shards(out: Path, classes: int, per_class: int, per_shard: int) -> list[str]:
    """Tiny JPEGs packed in class order (an image-folder tree tarred as it lies)."""
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 30, 200)).save(buf, format="JPEG")
    jpeg = buf.getvalue()
    paths, n = [], 0
    labels = [c for c in range(classes) for _ in range(per_class)]
    for start in range(0, len(labels), per_shard):
        path = out / f"sorted-{start // per_shard:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for label in labels[start:start + per_shard]:
                for ext, data in (("jpg", jpeg), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"s{n:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                n += 1
        paths.append(str(path))
    return paths


def _expected_distinct(classes: int, per_class: int, batch: int) -> float:
    """Mean distinct classes in a batch drawn without replacement from a uniform permutation."""
    total = classes * per_class
    absent = 1.0
    for i in range(batch):
        absent *= (total - per_class - i) / (total - i)
    return classes * (1 - absent)


@pytest.mark.parametrize("backend", ["threads", "dali"])
def test_a_shuffled_epoch_of_class_sorted_shards_mixes_like_a_permutation(tmp_path: Path, backend: str) -> None:
    classes, per_class, batch = 50, 40, 64
    shards = _class_sorted_shards(tmp_path, classes, per_class, per_shard=200)
    spec = {**SMALL_SPEC, "pipeline": {"image": ["decode", {"resize": {"size": [8, 8]}}, "normalize"],
                                       "label": ["label"]}}
    loader = feedfast.DataLoader(spec, shards=shards, batch_size=batch, shuffle=True, backend=backend, num_workers=2)
    distinct, seen = [], Counter()
    for _, labels in loader:
        distinct.append(len(set(labels.tolist())))
        seen.update(labels.tolist())
    assert seen == Counter({c: per_class for c in range(classes)})  # every sample exactly once
    want = _expected_distinct(classes, per_class, batch)  # 36.0 here
    got = float(np.mean(distinct[:-1]))  # full batches
    assert got >= 0.95 * want, (got, want)  # the old shard + buffer shuffle gave about 0.4 of it
