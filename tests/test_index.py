"""Tar indexes: PAX and GNU long names, DALI reading through our index, reuse and errors."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Callable

import pytest

import feedfast
from feedfast.errors import ShardError
from feedfast.shards.index.tarindex import (
    Member,
    Sample,
    cached_index_path,
    default_index_path,
    format_index,
    load_index,
    parse_index,
    scan_tar,
)

LABEL_SPEC = {"pipeline": {"label": ["label"]}, "source": {"components": {"label": {"ext": "cls", "kind": "label"}}}}
LONG_DIR = "deep/" + "d" * 120 + "/"
KEYS = [
    "plain-000",
    LONG_DIR + "long-" + "x" * 130,          # > 100 chars: PAX path record / GNU ././@LongLink
    "ünïcødé/naïve-名前-001",                  # non-ASCII: PAX stores it as UTF-8
    LONG_DIR + "ünïcødé-" + "y" * 110,
    "plain-004",
]


def write_tar(path: Path, keys: list[str], fmt: int, *, extra: bytes = b"") -> dict[str, bytes]:
    """A tar of samples ``key.txt`` (some payload) then ``key.cls`` (the sample's position)."""
    contents: dict[str, bytes] = {}
    with tarfile.open(path, "w", format=fmt, encoding="utf-8") as tar:
        for i, key in enumerate(keys):
            for ext, data in (("txt", f"payload of {key}\n".encode() * (i + 1) + extra), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                contents[info.name] = data
    return contents


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def test_scan_tar_long_and_non_ascii_names(tmp_path: Path, fmt: int) -> None:
    shard = tmp_path / "s.tar"
    contents = write_tar(shard, KEYS, fmt)
    samples = scan_tar(shard)
    assert [s.key for s in samples] == KEYS
    assert all(s.exts == ("txt", "cls") for s in samples)
    raw = shard.read_bytes()
    for s in samples:
        for m in s.members:
            assert m.name == f"{m.key}.{m.ext}"
            assert raw[m.offset: m.offset + m.size] == contents[m.name]
            assert m.offset % 512 == 0


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def test_dali_reads_long_names_through_our_index(tmp_path: Path, fmt: int) -> None:
    shard = tmp_path / "s.tar"
    write_tar(shard, KEYS, fmt)
    loader = feedfast.DataLoader(LABEL_SPEC, shards=[str(shard)], batch_size=2, shuffle=False, num_workers=1,
                                 rank=0, world_size=1)
    labels, keys = [], []
    for (batch,) in loader:
        labels += batch[: loader.last_valid].tolist()
        keys += [k for _, k in loader.last_origins[: loader.last_valid]]
    assert labels == list(range(len(KEYS)))
    assert keys == KEYS


def test_origin_key_of_a_name_with_a_space(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    write_tar(shard, ["a b", "100%"], tarfile.PAX_FORMAT)
    loader = feedfast.DataLoader(LABEL_SPEC, shards=[str(shard)], batch_size=2, shuffle=False, num_workers=1,
                                 rank=0, world_size=1)
    (batch,) = next(iter(loader))
    assert batch.tolist() == [0, 1]
    assert [k for _, k in loader.last_origins] == ["a b", "100%"]


def test_format_parse_round_trip_with_awkward_names() -> None:
    names = ["a b.jpg", "100%.cls", "x/y z%20w.seg.png", "new\nline.txt", "名前.jpg"]
    samples = [Sample(n.split(".")[0], (Member(n.split(".")[0], n.split(".", 1)[1], 512 * (i + 1), 10 + i, n),))
               for i, n in enumerate(names)]
    text = format_index(samples)
    assert text.startswith(f"v1.2 {len(samples)}\n")
    assert all(len(row.split(" ")) == 4 for row in text.splitlines()[1:])
    assert parse_index(text) == samples


def test_round_trip_of_a_scanned_tar(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    write_tar(shard, KEYS, tarfile.PAX_FORMAT)
    samples = scan_tar(shard)
    assert parse_index(format_index(samples)) == samples


def test_parse_index_rejects_other_text() -> None:
    with pytest.raises(ShardError):
        parse_index("v1.1 3\n")
    with pytest.raises(ShardError):
        parse_index("")


def test_index_beside_shard_is_reused(tmp_path: Path) -> None:
    shard = tmp_path / "train-0000.tar"
    write_tar(shard, KEYS, tarfile.PAX_FORMAT)
    where, samples = load_index(shard, tmp_path / "cache")
    assert where == default_index_path(shard) == tmp_path / "train-0000.idx"
    before = where.stat().st_mtime_ns
    os.utime(where, ns=(before + 10**9, before + 10**9))  # an unmistakable mtime to compare against
    again, samples2 = load_index(shard, tmp_path / "cache")
    assert again == where and samples2 == samples
    assert where.stat().st_mtime_ns == before + 10**9
    assert not (tmp_path / "cache").exists()


def test_modified_shard_is_reindexed(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    write_tar(shard, KEYS, tarfile.PAX_FORMAT)
    where, old = load_index(shard, tmp_path / "cache")
    stale = where.stat().st_mtime_ns - 100 * 10**9
    os.utime(where, ns=(stale, stale))  # the index predates the rewrite below
    write_tar(shard, ["new-a", "new-b"], tarfile.PAX_FORMAT, extra=b"z" * 5000)
    again, new = load_index(shard, tmp_path / "cache")
    assert again == where
    assert [s.key for s in old] == KEYS
    assert [s.key for s in new] == ["new-a", "new-b"] == [s.key for s in parse_index(where.read_text())]
    assert where.stat().st_mtime_ns >= shard.stat().st_mtime_ns


def test_shrunk_shard_with_an_old_mtime_is_reindexed(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    write_tar(shard, KEYS, tarfile.PAX_FORMAT)
    where, _ = load_index(shard, tmp_path / "cache")
    write_tar(shard, ["only"], tarfile.USTAR_FORMAT)
    t = where.stat().st_mtime_ns - 10**9  # older than the index: only the size check can notice
    os.utime(shard, ns=(t, t))
    _, new = load_index(shard, tmp_path / "cache")
    assert [s.key for s in new] == ["only"]


def test_read_only_folder_indexes_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    shard = folder / "s.tar"
    write_tar(shard, KEYS, tarfile.PAX_FORMAT)
    cache = tmp_path / "cache"
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        if os.access(folder, os.W_OK):  # root ignores permissions: pretend the folder is read-only
            real = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == folder else real(p, mode))
        where, samples = load_index(shard, cache)
        assert where == cached_index_path(shard, cache) and where.parent == cache / "index"
        assert not default_index_path(shard).exists()
        assert parse_index(where.read_text()) == samples
        stamp = where.stat().st_mtime_ns
        again, samples2 = load_index(shard, cache)
        assert again == where and samples2 == samples and where.stat().st_mtime_ns == stamp
    finally:
        folder.chmod(0o755)


def _valid_tar(path: Path) -> None:
    write_tar(path, KEYS, tarfile.PAX_FORMAT, extra=b"q" * 3000)


def test_missing_shard(tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="not found"):
        load_index(tmp_path / "nope.tar", tmp_path / "cache")
    with pytest.raises(ShardError, match="not found"):
        scan_tar(tmp_path / "nope.tar")


def test_directory_shard(tmp_path: Path) -> None:
    (tmp_path / "dir.tar").mkdir()
    with pytest.raises(ShardError, match="not a file"):
        load_index(tmp_path / "dir.tar", tmp_path / "cache")
    with pytest.raises(ShardError, match="directory"):
        scan_tar(tmp_path / "dir.tar")


def test_not_a_tar(tmp_path: Path) -> None:
    shard = tmp_path / "noise.tar"
    shard.write_bytes(bytes((i * 197 + 13) % 251 for i in range(4096)))
    with pytest.raises(ShardError, match="not a readable tar"):
        load_index(shard, tmp_path / "cache")
    assert not default_index_path(shard).exists()


def _cut_copy(tmp_path: Path, cut_at: Callable[[list[Sample]], int]) -> Path:
    """A copy of a valid tar cut at ``cut_at(its samples)`` bytes."""
    good = tmp_path / "good.tar"
    _valid_tar(good)
    shard = tmp_path / "cut.tar"
    shard.write_bytes(good.read_bytes()[: cut_at(scan_tar(good))])
    return shard


@pytest.mark.parametrize("sample", [-1, 1], ids=["plain-name", "pax-long-name"])
def test_tar_cut_inside_member_data(tmp_path: Path, sample: int) -> None:
    shard = _cut_copy(tmp_path, lambda s: s[sample].members[0].offset + s[sample].members[0].size // 2)
    with pytest.raises(ShardError, match="truncated"):
        scan_tar(shard)
    with pytest.raises(ShardError, match="truncated"):
        load_index(shard, tmp_path / "cache")
    assert not default_index_path(shard).exists()


def test_tar_cut_inside_a_member_header(tmp_path: Path) -> None:
    shard = _cut_copy(tmp_path, lambda s: s[-1].members[0].offset - 512 + 100)
    with pytest.raises(ShardError, match="truncated"):
        load_index(shard, tmp_path / "cache")


@pytest.mark.parametrize("kind", ["end-of-archive only", "zero bytes", "directories only"])
def test_empty_shard(tmp_path: Path, kind: str) -> None:
    shard = tmp_path / "empty.tar"
    if kind == "zero bytes":
        shard.write_bytes(b"")
    else:
        with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
            if kind == "directories only":
                info = tarfile.TarInfo("some/dir")
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
    with pytest.raises(ShardError):
        load_index(shard, tmp_path / "cache")
    assert not default_index_path(shard).exists()


def test_tar_cut_at_a_member_boundary(tmp_path: Path) -> None:
    """tarfile reads such a tar as complete; its last samples would be lost without a word."""
    shard = _cut_copy(tmp_path, lambda s: s[-2].members[-1].offset + 512)  # the end of a .cls member's data block
    with pytest.raises(ShardError, match=r"cut\.tar.*no end-of-archive"):
        scan_tar(shard)
    with pytest.raises(ShardError, match=r"cut\.tar.*no end-of-archive"):
        load_index(shard, tmp_path / "cache")
    assert not default_index_path(shard).exists()


def test_escaped_names_are_one_word_of_one_line_and_come_back() -> None:
    from feedfast.shards.index.tarindex import escape_name, unescape_name

    for name in ["a\rb", "c\u2028d", "e\u2029f", "g\x85h", "t\tu", "v\x0bw\x0cx", "y\x1cz\x1d", "%", "%20",
                 " lead", "nb\u00a0sp", "名前", "\udcff\udc80raw", "nul\x00x", "plain"]:
        escaped = escape_name(name)
        assert escaped.isascii() or not any(c in escaped for c in "\r\n\u2028\u2029\x85 \t")
        assert len(escaped.splitlines()) == 1 and escaped.split() == [escaped]
        assert unescape_name(escaped) == name
    assert escape_name("plain.jpg") == "plain.jpg"
    assert unescape_name("a%20b%0Ac%25") == "a b\nc%"  # what earlier feedfast versions wrote reads the same


def test_notes_on_the_first_line_round_trip_and_dali_style_readers_see_the_count() -> None:
    from feedfast.shards.index.notes import IndexNotes
    from feedfast.shards.index.tarindex import parse_index_notes

    samples = [Sample("a", (Member("a", "cls", 512, 1, "a.cls"),))]
    notes = IndexNotes(1, "1024:abc", ("x y", "k,1"), "shard 's.tar' is cut: at offset 9", ("b:c",))
    text = format_index(samples, notes)
    assert text.split("\n")[0].split()[:2] == ["v1.2", "1"] and "\n" not in text.split("\n")[0]
    assert parse_index_notes(text) == (samples, notes)
    assert [k for k, _ in notes.left_out()] == ["x y", "k,1", "b:c", "?"]
    with pytest.raises(ShardError, match="declares 2 samples on its first line but lists 1"):
        parse_index(text.replace("v1.2 1", "v1.2 2", 1))


def test_a_repeated_key_is_noted_on_the_index_and_left_out_again_when_it_is_read(tmp_path: Path) -> None:
    from feedfast.shards.index.tarindex import left_out

    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tar:
        for name in ("a.txt", "a.cls", "a.txt", "a.cls", "b.txt"):  # two adjacent copies of a
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    with pytest.warns(UserWarning, match=r"1 sample\(s\) repeat a key.*'a'"):
        where, samples = load_index(shard, tmp_path / "cache")
    assert [s.key for s in samples] == ["a", "b"] and samples[0].exts == ("txt", "cls")
    assert [k for k, _ in left_out(where)] == ["a"]
    assert [s.key for s in scan_tar(shard, keep_duplicates=True)] == ["a", "a", "b"]


def test_salvage_indexes_the_samples_before_the_damage_into_the_cache(tmp_path: Path) -> None:
    from feedfast.shards.index.tarindex import cached_index_path, left_out

    shard = _cut_copy(tmp_path, lambda s: s[-1].members[0].offset + 10)  # inside the last sample's .txt
    where, samples = None, None
    with pytest.warns(UserWarning, match=r"cut\.tar.*reading its 4 complete sample"):
        where, samples = load_index(shard, tmp_path / "cache", salvage=True)
    assert where == cached_index_path(shard, tmp_path / "cache") and not default_index_path(shard).exists()
    assert [s.key for s in samples] == KEYS[:4]
    assert [k for k, _ in left_out(where)] == [KEYS[4], "?"]
    assert load_index(shard, tmp_path / "cache", salvage=True) == (where, samples)  # reused
    with pytest.raises(ShardError, match=r"cut\.tar.*at offset \d+"):
        load_index(shard, tmp_path / "cache")  # the same error as ever without salvage


def test_an_index_that_does_not_describe_its_shard_is_rebuilt_with_the_reason(tmp_path: Path) -> None:
    from feedfast.shards.index.tarindex import checked_index

    shard = tmp_path / "s.tar"
    write_tar(shard, KEYS, tarfile.PAX_FORMAT)
    where, samples = load_index(shard, tmp_path / "cache")
    good = where.read_text()
    lines = good.split("\n")
    for broken, reason in [
        ("\n".join(lines[:2] + lines[3:]), "declares 5 samples on its first line but lists 4"),
        ("\n".join(lines[:2] + [lines[1]] + lines[3:]), "lists key 'plain-000' twice"),
        (good.replace(" 512 ", " 1024 ", 1), "the header before it is"),
        ("\n".join([lines[0].split(" fingerprint=")[0] + " fingerprint=0:00"] + lines[1:]), "fingerprint differs"),
        ("v1.2 5\n" + "garbage\n" * 5, "line 2 of the index is damaged"),
    ]:
        where.write_text(broken)
        found = checked_index(shard, where)
        assert isinstance(found, str) and reason in found, (reason, found)
        with pytest.warns(UserWarning, match="does not describe shard"):
            assert load_index(shard, tmp_path / "cache") == (where, samples)
        assert checked_index(shard, where) == (samples, parse_index_notes_of(where))


def parse_index_notes_of(where: Path) -> object:
    from feedfast.shards.index.tarindex import parse_index_notes

    return parse_index_notes(where.read_text())[1]
