"""Environment variables that are set but unusable: launcher variables that are not integers, a cache variable
naming a file. Each is a UserError naming the variable and value, never rank 0 or a raw OSError."""

from __future__ import annotations

from pathlib import Path

import pytest

import feedfast
from feedfast import _env
from feedfast.errors import UserError
from tests.helpers import make_shards

BAD = ["abc", "1.0", "0x1", "１", "1 2", "--1"]


@pytest.mark.parametrize("name", _env.LAUNCHER_VARIABLES)
@pytest.mark.parametrize("value", BAD)
def test_a_launcher_variable_that_is_not_an_integer_is_a_user_error(monkeypatch: pytest.MonkeyPatch, name: str,
                                                                     value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=f"{name}={value!r} is not an integer"):
        _env.launcher_rank()


@pytest.mark.parametrize(("text", "value"), [("3", 3), (" 2\n", 2), ("+1", 1), ("-1", -1), ("", None), ("  ", None)])
def test_integers_are_read_and_empty_means_unset(monkeypatch: pytest.MonkeyPatch, text: str, value: int | None) -> None:
    monkeypatch.setenv("LOCAL_RANK", text)
    assert _env.launcher_local_rank() == value


@pytest.mark.parametrize(("name", "value"), [("RANK", "abc"), ("RANK", "1.0"), ("WORLD_SIZE", "2.0"),
                                             ("LOCAL_RANK", "abc"), ("LOCAL_WORLD_SIZE", "x")])
def test_the_loader_refuses_them(monkeypatch: pytest.MonkeyPatch, shards: list[str], small_spec: dict, name: str,
                                 value: str) -> None:
    for other in _env.LAUNCHER_VARIABLES:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=f"{name}={value!r}"):
        feedfast.DataLoader(small_spec, shards=shards, backend="threads", num_workers=1)


def test_a_bad_rank_with_an_explicit_rank_and_world_size_is_not_read(monkeypatch: pytest.MonkeyPatch,
                                                                     shards: list[str], small_spec: dict) -> None:
    monkeypatch.setenv("RANK", "abc")
    loader = feedfast.DataLoader(small_spec, shards=shards, backend="threads", num_workers=1, rank=1, world_size=2)
    assert (loader.rank, loader.world) == (1, 2)


@pytest.mark.parametrize("under", ["", "cache"])
def test_a_cache_variable_naming_a_file_is_a_user_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        small_spec: dict, under: str) -> None:
    """FEEDFAST_CACHE naming a plain file (or a path under one): a UserError naming the variable and the fix, at the
    loader's construction, never a raw NotADirectoryError; doctor reports it as an unwritable cache."""
    from feedfast.cli import sysprobe

    shards = make_shards(tmp_path / "shards", samples=6, per_shard=3)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    value = str(blocker / under) if under else str(blocker)
    monkeypatch.setenv("FEEDFAST_CACHE", value)
    with pytest.raises(UserError, match=f"FEEDFAST_CACHE={value!r} .*, not a folder: .*set FEEDFAST_CACHE to a folder"):
        feedfast.DataLoader(small_spec, shards=shards, backend="threads", num_workers=1)
    cache = sysprobe.cache_folder()
    assert cache["writable"] is False and "FEEDFAST_CACHE" in cache["reason"]
