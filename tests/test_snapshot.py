"""Opening local shards again costs O(shards): the recorded result, used only while every file it names is unchanged."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from feedfast.sources import dataset as dataset_module
from feedfast.sources.dataset import open_shards
from feedfast.spec.load import load_spec
from tests.helpers import SMALL_SPEC, make_shards


def _no_index_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a recorded open read an index")

    monkeypatch.setattr(dataset_module, "locate", refuse)


def test_a_second_open_reads_no_index_and_gives_the_same_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = make_shards(tmp_path / "data", samples=23, per_shard=5)
    spec = load_spec(SMALL_SPEC)
    first = open_shards(shards, spec, tmp_path / "cache")
    _no_index_reads(monkeypatch)
    second = open_shards(shards, spec, tmp_path / "cache")
    assert second == first


def test_a_changed_shard_or_other_settings_open_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = make_shards(tmp_path / "data", samples=23, per_shard=5)
    spec = load_spec(SMALL_SPEC)
    open_shards(shards, spec, tmp_path / "cache")
    calls: list[str] = []
    real = dataset_module.locate
    monkeypatch.setattr(dataset_module, "locate", lambda name, *a, **k: calls.append(name) or real(name, *a, **k))
    open_shards(shards, spec, tmp_path / "cache", max_pixels=10**7)  # another pixel limit: another record
    assert len(calls) == len(shards)
    later = time.time() + 5
    os.utime(shards[2], (later, later))  # touched: its identity changed
    calls.clear()
    open_shards(shards, spec, tmp_path / "cache")
    assert len(calls) == len(shards)


def test_a_record_whose_index_changed_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = make_shards(tmp_path / "data", samples=10, per_shard=5)
    spec = load_spec(SMALL_SPEC)
    opened = open_shards(shards, spec, tmp_path / "cache")
    later = time.time() + 5
    os.utime(opened.index_paths[0], (later, later))
    calls: list[str] = []
    real = dataset_module.locate
    monkeypatch.setattr(dataset_module, "locate", lambda name, *a, **k: calls.append(name) or real(name, *a, **k))
    open_shards(shards, spec, tmp_path / "cache")
    assert calls == shards


def test_a_shard_rewritten_in_place_with_the_same_size_and_mtime_opens_afresh(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The record holds each shard's content fingerprint (was: path, size and mtime only)."""
    shards = make_shards(tmp_path / "data", samples=10, per_shard=5)
    spec = load_spec(SMALL_SPEC)
    open_shards(shards, spec, tmp_path / "cache")
    st = os.stat(shards[1])
    from feedfast.shards.index.tarindex import scan_tar

    label = scan_tar(shards[1])[-1].members[-1]
    raw = bytearray(Path(shards[1]).read_bytes())
    assert label.ext == "cls" and label.size == 1
    raw[label.offset] = ord("0") + (raw[label.offset] - ord("0") + 1) % 10  # the last label: same size
    Path(shards[1]).write_bytes(bytes(raw))
    os.utime(shards[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    calls: list[str] = []
    real = dataset_module.locate
    monkeypatch.setattr(dataset_module, "locate", lambda name, *a, **k: calls.append(name) or real(name, *a, **k))
    with pytest.warns(UserWarning, match="content fingerprint differs"):
        open_shards(shards, spec, tmp_path / "cache")
    assert calls == shards
    calls.clear()
    open_shards(shards, spec, tmp_path / "cache")  # recorded again: the next open reads no index
    assert calls == []
