"""feedfast.files.read: a step's files read by path in one call (C, the GIL released) are what Python reads."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from feedfast.errors import SampleError
from feedfast.files import read
from feedfast.files.listing import list_folder
from feedfast.files.read import FileReader
from tests.helpers import image_tree


@pytest.fixture(params=["c", "python"])
def reader_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c" and read._read_files is None:
        pytest.skip("feedfast._plan is not built")
    if request.param == "python":
        monkeypatch.setattr(read, "_read_files", None)
    return str(request.param)


def _table(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = image_tree(tmp_path / "train")
    (root / "cat" / "dangling.jpg").unlink()  # every listed file readable
    return list_folder(root, cache_dir=tmp_path / "cache")


def test_reads_what_python_reads(tmp_path: Path, reader_kind: str) -> None:
    table = _table(tmp_path)
    reader = FileReader(table)
    order = np.random.default_rng(0).permutation(len(table))
    data, ends = reader.read(order)
    for k, i in enumerate(order.tolist()):
        with open(table.full_path(i), "rb") as f:
            assert data[ends[k]: ends[k + 1]].tobytes() == f.read()
    out = np.empty(1 << 16, dtype=np.uint8)  # a reused buffer
    again, _ = reader.read(order[:3], out)
    assert again.base is out or np.shares_memory(again, out)
    assert again.tobytes() == data[: ends[3]].tobytes()


def test_missing_file_named(tmp_path: Path, reader_kind: str) -> None:
    table = _table(tmp_path)
    rel = [table.path(i) for i in range(len(table))]
    (tmp_path / "train" / "dog" / "café ü.jpg").unlink()
    with pytest.raises(SampleError, match=r"sample 'dog/café ü\.jpg': No such file or directory"):
        FileReader(table).read(np.arange(len(table)))
    assert FileReader(table).read(np.array([rel.index("cat/1.jpg")]))[0].size  # the others still read


def test_changed_size_named(tmp_path: Path, reader_kind: str) -> None:
    table = _table(tmp_path)
    (tmp_path / "train" / "cat" / "1.jpg").write_bytes(b"longer than it was")
    with pytest.raises(SampleError, match=r"'cat/1\.jpg': it is 18 bytes now, \d+ when the folder was listed"):
        FileReader(table).read(np.arange(len(table)))


def test_file_unreadable_when_listed_named(tmp_path: Path, reader_kind: str) -> None:
    table = list_folder(image_tree(tmp_path / "train"), cache_dir=tmp_path / "cache")
    rel = [table.path(i) for i in range(len(table))]
    with pytest.raises(SampleError, match=r"'cat/dangling\.jpg': No such file or directory"):
        FileReader(table).read(np.array([rel.index("cat/1.jpg"), rel.index("cat/dangling.jpg")]))


def test_gil_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if read._read_files is None:
        pytest.skip("feedfast._plan is not built")
    table = _table(tmp_path)
    reader = FileReader(table)
    many = np.tile(np.arange(len(table)), 2000)
    monkeypatch.setattr(sys, "getswitchinterval", sys.getswitchinterval)
    sys.setswitchinterval(10.0)  # Python never takes the GIL from the reading thread: only the read can give it up
    finished: list[float] = []

    def count() -> None:
        for _ in range(200_000):
            pass
        finished.append(time.perf_counter())

    try:
        counter = threading.Thread(target=count)
        counter.start()
        reader.read(many)
        returned = time.perf_counter()
    finally:
        sys.setswitchinterval(0.005)
    counter.join()
    assert finished[0] < returned  # it counted while the files were read
