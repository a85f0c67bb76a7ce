"""feedfast.files.filelist: `path label` lines and CSV, relative to the list's folder; bad lines named with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedfast.errors import ShardError, UserError
from feedfast.files.filelist import read_file_list
from tests.helpers import age_tree


@pytest.fixture()
def images(tmp_path: Path) -> Path:
    for name in ("cats/1.jpg", "cats/my cat.jpg", "dogs/a,b.png", "dogs/ü.jpeg"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    return tmp_path


def _list(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_text_lines(images: Path) -> None:
    absolute = images / "dogs" / "ü.jpeg"
    table = read_file_list(_list(images / "train.txt", f"# a comment\ncats/1.jpg 0\n\ncats/my cat.jpg  1\r\n"
                                 f"{absolute} 7\n"), cache_dir=images / "cache")
    assert [table.path(i) for i in range(len(table))] == ["cats/1.jpg", "cats/my cat.jpg", str(absolute)]
    assert table.labels.tolist() == [0, 1, 7]
    assert table.sizes.tolist() == [len(b"cats/1.jpg"), len(b"cats/my cat.jpg"), len("dogs/ü.jpeg".encode())]
    assert table.full_path(0) == str(images / "cats" / "1.jpg") and table.classes == []


@pytest.mark.parametrize("header", ["", "path,label\n", "filename,class\n"])
def test_csv_with_or_without_header(images: Path, header: str) -> None:
    table = read_file_list(_list(images / "train.csv", f'{header}cats/1.jpg,3\n"dogs/a,b.png", 4\n'),
                           cache_dir=images / "cache")
    assert [table.path(i) for i in range(len(table))] == ["cats/1.jpg", "dogs/a,b.png"]
    assert table.labels.tolist() == [3, 4]


def test_list_in_a_subfolder_is_relative_to_it(images: Path) -> None:
    (images / "lists").mkdir()
    table = read_file_list(_list(images / "lists" / "val.txt", "../cats/1.jpg 2\n"), cache_dir=images / "cache")
    assert Path(table.full_path(0)).resolve() == images / "cats" / "1.jpg"


@pytest.mark.parametrize(("name", "text", "message"), [
    ("l.txt", "cats/1.jpg 0\ncats/1.jpg\n", r"'.*l\.txt', line 2: it has no label: 'cats/1\.jpg'; write one `path label`"),
    ("l.txt", "cats/1.jpg 0\ncats/1.jpg cat\n", r"line 2: the label 'cat' is not a whole number"),
    ("l.txt", "cats/1.jpg -1\n", r"line 1: the label '-1' is not a whole number"),
    ("l.txt", "path label\ncats/1.jpg 0\n", r"line 1: the label 'label'"),  # no header in the text form
    ("l.csv", "path,label\ncats/1.jpg,0,extra\n", r"line 2: it has 3 fields, not 2.*`path,label` row"),
    ("l.csv", "path,label\ncats/1.jpg,0\ndogs/ü.jpeg,dog\n", r"line 3: the label 'dog'"),
    ("l.csv", "cats/1.jpg\n", r"line 1: it has no label"),
    ("l.txt", "# nothing\n\n", r"names no file"),
])
def test_bad_lines_name_file_line_and_fix(images: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        read_file_list(_list(images / name, text), cache_dir=images / "cache")


def test_missing_file_named_with_its_line(images: Path) -> None:
    with pytest.raises(ShardError, match=r"line 2: cannot read 'cats/2\.jpg' \(No such file or directory\)"):
        read_file_list(_list(images / "l.txt", "cats/1.jpg 0\ncats/2.jpg 0\n"), cache_dir=images / "cache")
    with pytest.raises(ShardError, match="cannot read the file list"):
        read_file_list(images / "none.txt", cache_dir=images / "cache")


def test_cached_until_the_list_or_a_folder_changes(images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from feedfast.files import filelist

    path = _list(images / "l.txt", "cats/1.jpg 0\ndogs/ü.jpeg 1\n")
    age_tree(images)
    read_file_list(path, cache_dir=images / "cache")
    parsed: list[str] = []
    parse = filelist.parse
    monkeypatch.setattr(filelist, "parse", lambda p: parsed.append(p) or parse(p))
    assert read_file_list(path, cache_dir=images / "cache").labels.tolist() == [0, 1]
    assert not parsed
    (images / "dogs" / "ü.jpeg").unlink()  # its folder changed: read again, and the file is missed
    with pytest.raises(ShardError, match="line 2"):
        read_file_list(path, cache_dir=images / "cache")
    _list(path, "cats/1.jpg 5\n")
    assert read_file_list(path, cache_dir=images / "cache").labels.tolist() == [5]
