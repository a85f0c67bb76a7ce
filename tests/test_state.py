"""Resume state: refused, with what differs, whenever it cannot be honoured."""

from __future__ import annotations

import json

import pytest

from feedfast.errors import UserError
from feedfast.loader.state import STATE_VERSION, check_state, shard_set_digest, spec_digest
from tests.helpers import SMALL_SPEC

SHARDS = shard_set_digest(["a.tar", "b.tar"], [100, 52])


def _state(**extra: object) -> dict:
    return {"version": STATE_VERSION, "epoch": 0, "step": 3, "seed": 3, "rank": 0, "world_size": 1,
            "dali": None, "stats": {}, "batch_size": 16, "shards": SHARDS, **extra}


def test_the_same_settings_are_accepted_and_the_state_is_json() -> None:
    json.dumps(_state())
    check_state(_state(), seed=3, rank=0, world=1, batch_size=16, shards=SHARDS)
    check_state(_state(), seed=3, rank=0, world=1)  # keywords left out are not compared


def test_another_batch_size_is_refused_naming_both() -> None:
    with pytest.raises(UserError, match="batch size 16 in the state vs 32 here"):
        check_state(_state(), seed=3, rank=0, world=1, batch_size=32, shards=SHARDS)


@pytest.mark.parametrize("paths,sizes", [(["a.tar"], [100]), (["b.tar", "a.tar"], [52, 100]),
                                         (["a.tar", "b.tar"], [100, 51]), (["a.tar", "b.tar", "c.tar"], [100, 52, 9])])
def test_another_shard_set_is_refused(paths: list[str], sizes: list[int]) -> None:
    with pytest.raises(UserError, match="another shard set"):
        check_state(_state(), seed=3, rank=0, world=1, shards=shard_set_digest(paths, sizes))


def test_every_difference_is_listed() -> None:
    with pytest.raises(UserError) as info:
        check_state(_state(spec="x"), seed=4, rank=0, world=1, batch_size=8, shards="other", spec="y")
    text = str(info.value)
    assert "seed" in text and "batch size" in text and "shard set" in text and "another spec" in text


def test_a_state_from_before_these_keys_is_still_accepted() -> None:
    old = {k: v for k, v in _state().items() if k not in ("batch_size", "shards")}
    check_state(old, seed=3, rank=0, world=1, batch_size=32, shards="other")


def test_not_a_state_is_refused() -> None:
    for bad in (None, [], {"version": 99}, {"version": STATE_VERSION}):
        with pytest.raises(UserError):
            check_state(bad, seed=3, rank=0, world=1)


def test_spec_digest_ignores_batch_size_only() -> None:
    from feedfast.spec.load import load_spec

    spec = load_spec(SMALL_SPEC)
    assert spec_digest(spec.to_dict()) == spec_digest(spec.replace(batch_size=99).to_dict())
    assert spec_digest(spec.to_dict()) != spec_digest(spec.replace(seed=99).to_dict())
