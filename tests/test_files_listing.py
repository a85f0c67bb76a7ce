"""feedfast.files.listing: an image folder's classes, files and labels exactly as torchvision's ImageFolder has them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from feedfast.errors import ShardError, UserError
from feedfast.files.listing import IMG_EXTENSIONS, list_folder
from tests.helpers import image_tree

datasets = pytest.importorskip("torchvision.datasets")


def test_extensions_are_torchvisions() -> None:
    from torchvision.datasets.folder import IMG_EXTENSIONS as torchvisions

    assert IMG_EXTENSIONS == torchvisions


def test_listing_equals_image_folder(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "train")
    expected = datasets.ImageFolder(str(root))
    table = list_folder(root, cache_dir=tmp_path / "cache")
    assert table.classes == expected.classes
    assert table.class_to_idx == expected.class_to_idx
    assert table.samples() == expected.samples
    assert table.labels.tolist() == expected.targets
    # the rules this tree exercises, as torchvision has them
    assert table.classes[:2] == [".hidden_class", "Dog"]  # a hidden folder is a class; upper case sorts first
    rel = [table.path(i) for i in range(len(table))]
    assert rel.index("cat/a/x.JPG") < rel.index("cat/a b/y.png") < rel.index("cat/a.b/q.webp") \
        < rel.index("cat/a/b/z.jpeg")  # folders sorted by whole path, not depth first
    assert {"cat/.hidden.jpg", "cat/.jpg", "cat/.cache/h.png", "dog/linked/x.JPG"} <= set(rel)
    assert not {"cat/notes.txt", "cat/x.jpg.txt", "cat/jpg", "dog/README", "top.jpg"} & set(rel)
    assert table.sizes[rel.index("cat/dangling.jpg")] == -1  # a broken link is listed, as torchvision lists it
    sizes = [os.path.getsize(root / p) for p in rel if p != "cat/dangling.jpg"]
    assert [int(s) for s in table.sizes if s >= 0] == sizes


def test_arrays_not_objects(tmp_path: Path) -> None:
    table = list_folder(image_tree(tmp_path / "train"), cache_dir=tmp_path / "cache")
    assert table.paths.dtype == np.uint8 and table.offsets.dtype == np.int64
    assert table.labels.dtype == np.int64 and table.sizes.dtype == np.int64
    assert len(table.offsets) == len(table) + 1 and table.offsets[-1] == len(table.paths)
    assert table.path(0).encode() == table.paths[table.starts[0]: table.starts[0] + table.lengths[0]].tobytes()


def test_empty_class_is_torchvisions_error(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "train", empty_class=True)
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes empty"):
        datasets.ImageFolder(str(root))
    with pytest.raises(ShardError, match="Found no valid file for the classes empty.*allow_empty=True"):
        list_folder(root, cache_dir=tmp_path / "cache")
    expected = datasets.ImageFolder(str(root), allow_empty=True)
    table = list_folder(root, cache_dir=tmp_path / "cache", allow_empty=True)
    assert (table.classes, table.samples()) == (expected.classes, expected.samples)


def test_hidden_class_without_images_is_an_error(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "train")
    (root / ".ipynb_checkpoints").mkdir()  # torchvision makes it a class, then finds it empty
    with pytest.raises(FileNotFoundError, match=r"\.ipynb_checkpoints"):
        datasets.ImageFolder(str(root))
    with pytest.raises(ShardError, match=r"\.ipynb_checkpoints"):
        list_folder(root, cache_dir=tmp_path / "cache")


def test_other_extensions(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "train")
    expected = datasets.DatasetFolder(str(root), loader=open, extensions=(".jpg", ".txt"), allow_empty=True)
    table = list_folder(root, cache_dir=tmp_path / "cache", extensions=(".jpg", ".txt"), allow_empty=True)
    assert table.samples() == expected.samples
    with pytest.raises(UserError, match="lower-case"):
        list_folder(root, cache_dir=tmp_path / "cache", extensions=(".JPG",))


def test_no_class_or_no_folder(tmp_path: Path) -> None:
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"x")
    with pytest.raises(ShardError, match="holds no class folder"):
        list_folder(tmp_path / "flat", cache_dir=tmp_path / "cache")
    with pytest.raises(ShardError, match="cannot read the image folder"):
        list_folder(tmp_path / "missing", cache_dir=tmp_path / "cache")


def test_unreadable_folder_left_out_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = image_tree(tmp_path / "train")
    scandir = os.scandir

    def refusing(path: str) -> object:  # as an unreadable folder does (chmod does not stop root)
        if os.fspath(path).endswith("dog/deep"):
            raise PermissionError(13, "Permission denied", path)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)  # os.walk, torchvision's walk, reads it too
    expected = datasets.ImageFolder(str(root))
    with pytest.warns(UserWarning, match="dog/deep.*Permission denied"):
        table = list_folder(root, cache_dir=tmp_path / "cache")
    assert table.samples() == expected.samples
    assert "dog/deep/er/est/d.bmp" not in [table.path(i) for i in range(len(table))]
