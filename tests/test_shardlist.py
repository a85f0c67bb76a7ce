"""Shard list files are data: a line never becomes a command unless the list is given as ``@@list.txt``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from feedfast.errors import ShardError
from feedfast.sources.shardlist import resolve_shards


@pytest.fixture()
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.tar").write_bytes(b"")
    return tmp_path


def _ran(here: Path) -> bool:
    return (here / "x").exists()


def test_a_comma_in_a_list_line_never_turns_data_into_a_command(here: Path) -> None:
    (here / "list.txt").write_text("a.tar,pipe:touch x\n")
    with pytest.raises(ShardError, match="shard not found: .*a.tar,pipe:touch x"):
        resolve_shards("@list.txt")
    (here / "a.tar,pipe:touch x").write_bytes(b"")  # a file of that name is what the line names
    assert resolve_shards("@list.txt") == ["a.tar,pipe:touch x"]
    assert not _ran(here)


@pytest.mark.parametrize("line", ["pipe:touch x", "  pipe:touch x  ", "pipe:{touch x,cat a.tar}"])
def test_a_pipe_line_in_a_list_is_refused_naming_file_and_line(here: Path, line: str) -> None:
    (here / "list.txt").write_text(f"# shards\na.tar\n{line}\n")
    with pytest.raises(ShardError, match=r"'list.txt', line 3: .* is a command.*@@list.txt"):
        resolve_shards("@list.txt")
    assert not _ran(here)


def test_lines_that_only_look_like_commands_stay_file_names(here: Path) -> None:
    (here / "pipe:touch x").write_bytes(b"")
    local = os.path.join(os.curdir, "pipe:touch x")
    (here / "url.txt").write_text("file://pipe:touch x\n")
    (here / "braces.txt").write_text("{pipe:touch x,a.tar}\n")
    assert resolve_shards("@url.txt") == [local]
    assert resolve_shards("@braces.txt") == [local, "a.tar"]
    assert resolve_shards("pipe*") == [os.path.join(os.curdir, "pipe:touch x")]  # a glob's match is a file
    assert not _ran(here)


def test_a_nested_list_gets_no_more_than_its_parent(here: Path) -> None:
    (here / "cmds.txt").write_text("pipe:touch x\n")
    (here / "outer.txt").write_text("@@cmds.txt\n")
    with pytest.raises(ShardError, match="is a command"):
        resolve_shards("@outer.txt")
    assert not _ran(here)
    assert resolve_shards("@@outer.txt") == ["pipe:touch x"]  # asked for: kept as a command (run when indexed)


def test_commands_the_user_gives_are_kept(here: Path) -> None:
    (here / "cmds.txt").write_text("pipe:cat a.tar\n")
    assert resolve_shards("@@cmds.txt") == ["pipe:cat a.tar"]
    assert resolve_shards(["pipe:cat a.tar", "a.tar"]) == ["pipe:cat a.tar", "a.tar"]


def test_a_list_that_names_itself_is_refused(here: Path) -> None:
    (here / "one.txt").write_text("@two.txt\n")
    (here / "two.txt").write_text("a.tar\n@one.txt\n")
    with pytest.raises(ShardError, match="names itself"):
        resolve_shards("@one.txt")


def test_nested_lists_are_relative_to_their_folder(here: Path) -> None:
    (here / "sub").mkdir()
    (here / "sub" / "b.tar").write_bytes(b"")
    (here / "sub" / "outer.txt").write_text("b.tar\n@inner.txt\n")
    (here / "sub" / "inner.txt").write_text("../a.tar\n")
    assert resolve_shards("@sub/outer.txt") == [os.path.join("sub", "b.tar"), os.path.join("sub", "..", "a.tar")]


def test_a_list_that_is_not_text_is_a_shard_error(here: Path) -> None:
    (here / "list.txt").write_bytes(b"\xff\xfe\x00a.tar\n")
    with pytest.raises(ShardError, match="not UTF-8"):
        resolve_shards("@list.txt")


@pytest.mark.parametrize("entry", ["hdfs://nn/a.tar", "@list.txt"])
def test_a_scheme_no_transport_reads_is_refused_by_name_wherever_it_is_written(here: Path, entry: str) -> None:
    (here / "list.txt").write_text("a.tar\ns3a://bucket/b.tar\n")
    scheme = "hdfs" if entry.startswith("hdfs") else "s3a"
    with pytest.raises(ShardError, match=rf"unsupported shard URL '{scheme}://.*the scheme '{scheme}'; feedfast reads "
                                         r"local paths, file://, http://, https://, s3://, gs://, pipe:CMD"):
        resolve_shards(entry)
