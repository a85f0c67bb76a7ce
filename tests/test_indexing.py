"""Cold indexing in worker processes: the same index files as load_index, errors and warnings brought back."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from feedfast.errors import ShardError, UserError
from feedfast.shards.index import indexing
from feedfast.shards.index import tarindex as index
from feedfast.shards.index.check import shard_fingerprint
from feedfast.shards.index.indexing import chunked, fresh_index, prepare_indexes, sample_count
from feedfast.shards.index.notes import IndexNotes
from feedfast.shards.index.tarindex import cached_index_path, default_index_path, format_index, load_index, scan_tar


def write_shards(folder: Path, count: int, per_shard: int = 3) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(count):
        path = folder / f"train-{s:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(per_shard):
                for ext, data in (("jpg", b"j" * (100 + i)), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"s{s}-{i}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def no_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, a tar scanned in this process fails the test."""
    def refuse(path: object, **_: object) -> None:
        raise AssertionError(f"scanned {path} again")

    monkeypatch.setattr(index, "scan_tar", refuse)


def test_prepare_writes_what_load_index_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_shards(tmp_path / "data", 9)
    prepare_indexes(paths, tmp_path / "cache", workers=2)
    for p in paths:
        assert default_index_path(p).read_text() == format_index(scan_tar(p), IndexNotes(3, shard_fingerprint(p)))
    assert not (tmp_path / "cache").exists()
    no_scans(monkeypatch)
    for p in paths:
        assert load_index(p, tmp_path / "cache")[0] == default_index_path(p)
    prepare_indexes(paths, tmp_path / "cache", workers=2)  # all fresh: nothing to do, no pool
    assert [sample_count(p, tmp_path / "cache") for p in paths] == [3] * 9


def test_read_only_folder_indexes_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ro"
    paths = write_shards(folder, 3)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    workers = 2
    try:
        if os.access(folder, os.W_OK):  # root ignores permissions: pretend, in this process (workers would not)
            real = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == folder else real(p, mode))
            workers = 1
        prepare_indexes(paths, tmp_path / "cache", workers=workers)
        for p in paths:
            assert fresh_index(p, tmp_path / "cache") == cached_index_path(p, tmp_path / "cache")
            assert not default_index_path(p).exists()
        no_scans(monkeypatch)
        assert all(load_index(p, tmp_path / "cache")[0] == cached_index_path(p, tmp_path / "cache") for p in paths)
    finally:
        folder.chmod(0o755)


def test_only_stale_shards_are_indexed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_shards(tmp_path / "data", 4)
    for p in paths:
        load_index(p, tmp_path / "cache")
    beside = default_index_path(paths[2])
    old = beside.stat().st_mtime_ns - 10**9
    os.utime(beside, ns=(old, old))  # older than its shard: stale
    assert [fresh_index(p, tmp_path / "cache") is None for p in paths] == [False, False, True, False]

    class NoPool:
        def __init__(self, *args: object) -> None:
            raise AssertionError("a pool for one shard")

    monkeypatch.setattr(indexing, "_Pool", NoPool)
    prepare_indexes(paths, tmp_path / "cache", workers=4)
    assert fresh_index(paths[2], tmp_path / "cache") == beside


def test_shrunk_shard_with_an_old_mtime_is_stale(tmp_path: Path) -> None:
    (path,) = write_shards(tmp_path, 1, per_shard=20)  # data beyond the 10 KiB the rewritten tar holds
    load_index(path, tmp_path / "cache")
    t = default_index_path(path).stat().st_mtime_ns - 10**9
    with tarfile.open(path, "w") as tar:
        tar.addfile(tarfile.TarInfo("only.cls"), io.BytesIO(b""))
    os.utime(path, ns=(t, t))
    assert fresh_index(path, tmp_path / "cache") is None
    prepare_indexes([path], tmp_path / "cache")
    assert sample_count(path, tmp_path / "cache") == 1


def test_errors_name_the_first_bad_shard_and_count_the_others(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "data", 6)
    for bad in (paths[1], paths[4]):
        raw = Path(bad).read_bytes()
        Path(bad).write_bytes(raw[:700])  # inside the first member's data
    missing = str(tmp_path / "data" / "gone.tar")
    with pytest.raises(ShardError, match=r"train-0001\.tar.*\(2 more shard\(s\) could not be indexed: .*train-0004"):
        prepare_indexes(paths + [missing], tmp_path / "cache", workers=2)
    assert [default_index_path(p).exists() for p in paths] == [True, False, True, True, False, True]


def test_warnings_of_workers_come_back(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "data", 3)
    with tarfile.open(paths[0], "w") as tar:
        for key in ("a", "b", "a"):
            info = tarfile.TarInfo(f"{key}.cls")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    with pytest.warns(UserWarning, match=r"train-0000\.tar.*repeat a key"):
        prepare_indexes(paths, tmp_path / "cache", workers=2)


def test_a_dead_worker_leaves_its_shards_to_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_shards(tmp_path / "data", 5)
    monkeypatch.setattr(indexing, "_BOOT", "import sys; sys.exit(3)  # {path} {package}")
    with pytest.warns(RuntimeWarning, match="index worker exited"):
        prepare_indexes(paths, tmp_path / "cache", workers=2)
    assert all(fresh_index(p, tmp_path / "cache") == default_index_path(p) for p in paths)


def test_progress_bar_and_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_shards(tmp_path / "data", 3)
    prepare_indexes(paths, tmp_path / "cache", workers=1, progress=True)
    assert "indexing" in capsys.readouterr().err
    with pytest.raises(UserError, match="workers must be at least 1, got 0"):
        prepare_indexes(paths, tmp_path / "cache", workers=0)


def test_chunks() -> None:
    paths = [str(i) for i in range(300)]
    assert [len(c) for c in chunked(paths[:10], 2)] == [2] * 5
    assert {len(c) for c in chunked(paths, 2)} == {32, 12} and sum(map(len, chunked(paths, 2))) == 300
    assert sum(chunked(paths, 8), []) == paths


def test_workers_salvage_a_damaged_shard_when_asked_and_name_it_when_not(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "data", 4)
    raw = Path(paths[2]).read_bytes()
    Path(paths[2]).write_bytes(raw[: scan_tar(paths[2])[2].members[0].offset + 10])  # cut inside its last sample
    with pytest.raises(ShardError, match=r"train-0002\.tar.*at offset \d+"):
        prepare_indexes(paths, tmp_path / "cache", workers=2)
    with pytest.warns(UserWarning, match=r"train-0002\.tar.*reading its 2 complete sample"):
        prepare_indexes(paths, tmp_path / "cache", workers=2, salvage=True)
    assert fresh_index(paths[2], tmp_path / "cache") == cached_index_path(paths[2], tmp_path / "cache")
    assert not default_index_path(paths[2]).exists()
    assert sample_count(paths[2], tmp_path / "cache") == 2


def test_an_index_recording_another_fingerprint_is_not_fresh(tmp_path: Path) -> None:
    (path,) = write_shards(tmp_path / "data", 1)
    prepare_indexes([path], tmp_path / "cache")
    assert fresh_index(path, tmp_path / "cache") == default_index_path(path)
    st = os.stat(path)
    raw = bytearray(Path(path).read_bytes())
    last = scan_tar(path)[-1].members[-1]
    raw[last.offset] = ord("7")  # the last label: same size, same mtime below
    Path(path).write_bytes(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fresh_index(path, tmp_path / "cache") is None
    with pytest.warns(UserWarning, match="content fingerprint differs"):
        prepare_indexes([path], tmp_path / "cache")  # rebuilt here (one shard: in this process)
    assert fresh_index(path, tmp_path / "cache") == default_index_path(path)
