"""A batch size that cannot be allocated is a UserError naming the sizes, before any buffer is made."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import feedfast
from feedfast import _env
from feedfast.errors import UserError
from feedfast.loader.batchsize import MAX_BATCH_SIZE, check_batch_size


def _labels(path: Path, count: int = 10) -> str:
    with tarfile.open(path, "w") as tar:
        for i in range(count):
            info = tarfile.TarInfo(f"s{i}.cls")
            info.size = len(str(i))
            tar.addfile(info, io.BytesIO(str(i).encode()))
    return str(path)


def _spec(size: int) -> dict:
    return {"source": {"components": {"label": {"ext": "cls", "kind": "label"}}}, "pipeline": {"label": ["label"]},
            "outputs": ["label"], "batch": {"size": size}, "device": "cpu"}


@pytest.mark.parametrize("backend", ["threads", "pil", "dali"])
def test_a_trillion_over_ten_samples_names_the_sizes(tmp_path: Path, backend: str) -> None:
    shard = _labels(tmp_path / "labels.tar")
    with pytest.raises(UserError, match=r"batch size 1,000,000,000,000 cannot be allocated: one batch is 7.28 TiB "
                                        r"\(8 B a sample\).*10 samples \(10 a rank over 1\).*at most 10"):
        feedfast.DataLoader(_spec(10**12), shards=shard, backend=backend, num_workers=1, cache_dir=tmp_path / "c")


def test_an_image_batch_larger_than_memory_is_refused(monkeypatch: pytest.MonkeyPatch, shards: list[str],
                                                      small_spec: dict) -> None:
    monkeypatch.setattr(_env, "physical_memory", lambda: 64 << 30)
    small_spec["batch"] = {"size": 10**8}  # 10**8 crops of 3 x 32 x 32 float32 and int64 labels: 1.12 TiB
    with pytest.raises(UserError, match=r"one batch is 1.12 TiB \(12.01 KiB a sample\), more than this machine's 64.00 GiB"):
        feedfast.DataLoader(small_spec, shards=shards, backend="threads", num_workers=1)


def test_a_batch_larger_than_the_dataset_that_fits_still_runs(tmp_path: Path) -> None:
    shard = _labels(tmp_path / "labels.tar")
    loader = feedfast.DataLoader(_spec(1000), shards=shard, backend="threads", num_workers=1, cache_dir=tmp_path / "c")
    assert [label.tolist() for label, in loader] == [list(range(10))]


def test_the_bounds() -> None:
    check_batch_size(MAX_BATCH_SIZE, samples=10, world=1, per_sample=1, memory=None)
    check_batch_size(1000, samples=10, world=1, per_sample=1000, memory=10**6)
    with pytest.raises(UserError, match="largest batch size DALI takes is 2,147,483,647"):
        check_batch_size(MAX_BATCH_SIZE + 1, samples=10, world=1, per_sample=1, memory=None)
    with pytest.raises(UserError, match=r"more than this machine's 976.56 KiB.*25 samples \(13 a rank over 2\)"):
        check_batch_size(1001, samples=25, world=2, per_sample=1000, memory=10**6)
