"""Launcher variables that are set but are not integers: a UserError naming the variable and value, never rank 0."""

from __future__ import annotations

import pytest

import feedfast
from feedfast import _env
from feedfast.errors import UserError

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
