"""The dataset's columnar index: the same locations and keys as the text indexes, mapped, rebuilt when they change."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest

from feedfast.errors import ShardError
from feedfast.shards.index import columnar
from feedfast.shards.index.columnar import dataset_index
from feedfast.shards.index.tarindex import first_member, load_index, read_index
from tests.helpers import make_shards

EXTS = [frozenset({"jpg", "jpeg"}), frozenset({"cls"})]


@pytest.fixture()
def dataset(tmp_path: Path) -> tuple[list[str], list[str], list[int]]:
    shards = make_shards(tmp_path / "data", samples=23, per_shard=5)
    idx = [str(load_index(p, tmp_path)[0]) for p in shards]
    return shards, idx, [len(read_index(i, p)) for p, i in zip(shards, idx)]


def test_it_holds_what_the_text_indexes_say(dataset: tuple[list[str], list[str], list[int]], tmp_path: Path) -> None:
    shards, idx, counts = dataset
    index = dataset_index(shards, idx, counts, EXTS, tmp_path / "cache")
    assert len(index) == sum(counts) == 23
    expected = [(k, s) for k, (p, i) in enumerate(zip(shards, idx)) for s in read_index(i, p)]
    where = index.take(np.arange(23))
    for n, (shard, sample) in enumerate(expected):
        assert int(where.shard[n]) == shard and index.key(n) == sample.key
        for c, exts in enumerate(EXTS):
            m = first_member(sample, exts)
            assert m is not None and (int(where.offsets[n, c]), int(where.sizes[n, c])) == (m.offset, m.size)
    assert index.keys([22, 0]) == [expected[22][1].key, expected[0][1].key]
    every = [sample.key for _, sample in expected]  # consecutive samples: their keys in one read
    assert index.keys(range(23)) == every and index.keys(range(4, 9)) == every[4:9] and index.keys([7]) == [every[7]]


def test_it_is_built_once_mapped_and_pickled_by_path(dataset: tuple[list[str], list[str], list[int]],
                                                       tmp_path: Path) -> None:
    shards, idx, counts = dataset
    a = dataset_index(shards, idx, counts, EXTS, tmp_path / "cache")
    assert dataset_index(shards, idx, counts, EXTS, tmp_path / "cache") is a
    assert len(list((tmp_path / "cache" / "columnar").iterdir())) == 1
    b = pickle.loads(pickle.dumps(a))
    assert len(pickle.dumps(a)) < 1000 and b.keys(range(23)) == a.keys(range(23))


def test_a_component_missing_from_a_sample_has_size_minus_one(dataset: tuple[list[str], list[str], list[int]],
                                                              tmp_path: Path) -> None:
    shards, idx, counts = dataset
    index = dataset_index(shards, idx, counts, [frozenset({"jpg"}), frozenset({"json"})], tmp_path / "cache")
    sizes = index.take(np.arange(23)).sizes
    assert (sizes[:, 1] == -1).all() and (sizes[:, 0] > 0).all()


def test_a_rewritten_index_is_read_again_and_a_short_one_refused(dataset: tuple[list[str], list[str], list[int]],
                                                                  tmp_path: Path) -> None:
    shards, idx, counts = dataset
    cache = tmp_path / "cache"
    dataset_index(shards, idx, counts, EXTS, cache)
    lines = Path(idx[0]).read_text().splitlines()
    Path(idx[0]).write_text("\n".join([lines[0]] + lines[1:3]) + "\n")  # two of five samples
    later = time.time() + 5
    os.utime(idx[0], (later, later))
    columnar._OPEN.clear()
    with pytest.raises(ShardError, match=r"declares 5 samples on its first line but lists 2"):
        dataset_index(shards, idx, counts, EXTS, cache)
    Path(idx[0]).write_text("\n".join(["v1.2 2"] + lines[1:3]) + "\n")  # consistent, but not what was opened
    os.utime(idx[0], (later + 1, later + 1))
    with pytest.raises(ShardError, match=r"lists 2 samples, not 5"):
        dataset_index(shards, idx, counts, EXTS, cache)


def test_an_index_rewritten_in_this_process_is_not_read_through_the_opened_copy(
        dataset: tuple[list[str], list[str], list[int]], tmp_path: Path) -> None:
    """The process's cache of opened indexes is keyed by the index files too (was: by their names only)."""
    shards, idx, counts = dataset
    first = dataset_index(shards, idx, counts, EXTS, tmp_path / "cache")
    text = Path(idx[0]).read_text()
    rows = text.split("\n")
    a, b = rows[1].split(" "), rows[2].split(" ")
    a[1:3], b[1:3] = b[1:3], a[1:3]  # the first two samples' images swapped
    tmp = Path(idx[0] + ".new")
    tmp.write_text("\n".join([rows[0], " ".join(a), " ".join(b)] + rows[3:]))
    os.replace(tmp, idx[0])  # a new file in place, as write_atomic writes an index
    again = dataset_index(shards, idx, counts, EXTS, tmp_path / "cache")
    assert again is not first
    assert again.take(np.array([0, 1])).offsets[:, 0].tolist() == first.take(np.array([1, 0])).offsets[:, 0].tolist()


def test_a_member_outside_its_shard_is_refused_naming_it(dataset: tuple[list[str], list[str], list[int]],
                                                        tmp_path: Path) -> None:
    shards, idx, counts = dataset
    rows = Path(idx[1]).read_text().split("\n")
    fields = rows[1].split(" ")
    fields[1] = "-512"
    Path(idx[1]).write_text("\n".join([rows[0], " ".join(fields)] + rows[2:]))
    with pytest.raises(ShardError, match=r"train-0001\.tar.*sample 0's component 0 at offset -512"):
        dataset_index(shards, idx, counts, EXTS, tmp_path / "cache")
