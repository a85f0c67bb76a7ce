"""feedfast.files.cache: a listing is kept, read back as memory maps, and listed again when a folder changed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from feedfast.files import listing
from feedfast.files.listing import list_folder
from tests.helpers import age_tree, image_tree


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the class folders walked from here on."""
    walked: list[str] = []
    walk = listing._walk_class

    def counted(top: str, name: str, extensions: tuple[str, ...]) -> listing._ClassFiles:
        walked.append(name)
        return walk(top, name, extensions)

    monkeypatch.setattr(listing, "_walk_class", counted)
    return walked


def test_kept_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = image_tree(tmp_path / "train")
    age_tree(root)
    walked = _walks(monkeypatch)
    first = list_folder(root, cache_dir=tmp_path / "cache")
    assert len(walked) == 5
    again = list_folder(root, cache_dir=tmp_path / "cache")
    assert len(walked) == 5  # not walked again
    assert isinstance(again.paths, np.memmap) and isinstance(again.labels, np.memmap)
    assert again.samples() == first.samples() and again.classes == first.classes
    assert again.sizes.tolist() == first.sizes.tolist()
    list_folder(root, cache_dir=tmp_path / "cache", refresh=True)
    assert len(walked) == 10


@pytest.mark.parametrize("change", ["add", "remove", "rename", "add_deep", "add_class"])
def test_a_changed_folder_is_listed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    root = image_tree(tmp_path / "train")
    age_tree(root)
    before = list_folder(root, cache_dir=tmp_path / "cache")
    if change == "add":
        (root / "dog" / "new.jpg").write_bytes(b"new")
    elif change == "remove":
        (root / "cat" / "1.jpg").unlink()
    elif change == "rename":
        (root / "cat" / "1.jpg").rename(root / "cat" / "0.jpg")
    elif change == "add_deep":
        (root / "dog" / "deep" / "er" / "est" / "e.jpg").write_bytes(b"e")
    else:
        (root / "ant").mkdir()
        (root / "ant" / "a.jpg").write_bytes(b"a")
    walked = _walks(monkeypatch)
    after = list_folder(root, cache_dir=tmp_path / "cache")
    assert walked  # listed again
    from torchvision.datasets import ImageFolder

    assert after.samples() == ImageFolder(str(root)).samples != before.samples()


def test_a_listing_of_a_folder_just_changed_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = image_tree(tmp_path / "train")  # its folders changed now: a change in the same tick could go unseen
    walked = _walks(monkeypatch)
    list_folder(root, cache_dir=tmp_path / "cache")
    list_folder(root, cache_dir=tmp_path / "cache")
    assert len(walked) == 10
    age_tree(root)
    list_folder(root, cache_dir=tmp_path / "cache")
    list_folder(root, cache_dir=tmp_path / "cache")
    assert len(walked) == 15


def test_old_versions_removed(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "train")
    age_tree(root)
    list_folder(root, cache_dir=tmp_path / "cache")
    (root / "dog" / "new.jpg").write_bytes(b"new")
    age_tree(root)
    table = list_folder(root, cache_dir=tmp_path / "cache")
    (entry,) = (tmp_path / "cache" / "files").iterdir()
    assert len([p for p in entry.iterdir() if p.is_dir()]) == 1
    assert "dog/new.jpg" in [table.path(i) for i in range(len(table))]


def test_damaged_cache_is_listed_again(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "train")
    age_tree(root)
    first = list_folder(root, cache_dir=tmp_path / "cache")
    (entry,) = (tmp_path / "cache" / "files").iterdir()
    version = entry / (entry / "current").read_text()
    (version / "labels.npy").write_bytes(b"garbage")
    assert list_folder(root, cache_dir=tmp_path / "cache").samples() == first.samples()


def test_parallel_cold_listing_shows_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "many"
    for c in range(40):
        (root / f"c{c:02d}").mkdir(parents=True)
        for i in range(3):
            (root / f"c{c:02d}" / f"{i}.jpg").write_bytes(b"x" * i)
    walk = listing._walk_class

    def slow(top: str, name: str, extensions: tuple[str, ...]) -> listing._ClassFiles:
        time.sleep(0.1)
        return walk(top, name, extensions)

    monkeypatch.setattr(listing, "_walk_class", slow)
    monkeypatch.setattr(listing, "PROGRESS_DELAY_S", 0.2)
    started = time.perf_counter()
    table = list_folder(root, cache_dir=tmp_path / "cache", workers=8, progress=True)
    assert time.perf_counter() - started < 40 * 0.1 / 2  # on threads
    assert len(table) == 120 and table.labels.tolist() == [c for c in range(40) for _ in range(3)]
    assert "listing many" in capsys.readouterr().err
    assert os.path.basename(table.root) == "many"
