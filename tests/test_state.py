"""Resume state as data: refused, with what differs or which field is wrong, whenever it cannot be honoured.

A state that cannot be honoured (another seed, batch size, shard set, spec) names what
differs; a damaged, truncated, tampered or foreign one names its first wrong field, in one
line. The property test: a state with any one field changed is either refused so, or
resumes exactly: the rest of the epoch from the point it names, no sample lost or repeated.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import feedfast
from feedfast.errors import UserError
from feedfast.loader.state import (
    STATE_VERSION,
    Identity,
    LoaderState,
    ResumePoint,
    encode_checkpoint,
    parse_state,
    shard_set_digest,
    spec_digest,
)
from tests.helpers import SMALL_SPEC

SHARDS = shard_set_digest(["a.tar", "b.tar"], [100, 52])
STATS = {"delivered": 12, "skipped": 0, "padded": 0, "dropped": 0, "batches": 3}


def _state(**extra: object) -> dict[str, Any]:
    return {"version": STATE_VERSION, "epoch": 0, "step": 3, "consumed": 0, "seed": 3, "rank": 0, "world_size": 1,
            "batch_size": 16, "partition": "shards", "shards": SHARDS, "spec": None, "backend": "threads",
            "stats": dict(STATS), "dali": None, "tuned": None, **extra}


def _check(state: dict[str, Any], **kw: Any) -> LoaderState:
    parsed = parse_state(state)
    parsed.check_matches(**kw)
    return parsed


def test_a_state_round_trips_through_json_and_the_typed_form() -> None:
    state = LoaderState(ResumePoint(2, 5, 0, "\x00\xffdali", 4), Identity(3, 1, 2, 16, "shards", SHARDS, "s"),
                        "dali", dict(STATS), {"threads": 3, "prefetch": 2})
    data = json.loads(json.dumps(state.to_dict()))
    assert data["dali"] == {"checkpoint": encode_checkpoint("\x00\xffdali"), "step": 4}
    assert parse_state(data) == state
    assert state.resume.skip == 1


def test_samples_skipped_mid_epoch_round_trip_grouped_by_shard_and_reason() -> None:
    lost = (("a.tar", "k1", "gone"), ("a.tar", "k2", "gone"), ("b.tar", "k9", "cut"), ("a.tar", "k3", "gone"))
    state = LoaderState(ResumePoint(0, 3, 0, None, 3), Identity(3, 0, 1, 16, "shards", SHARDS, None), "threads", dict(STATS),
                        lost=lost)
    data = json.loads(json.dumps(state.to_dict()))
    assert data["lost"] == [{"shard": "a.tar", "reason": "gone", "keys": ["k1", "k2"]},
                            {"shard": "b.tar", "reason": "cut", "keys": ["k9"]},
                            {"shard": "a.tar", "reason": "gone", "keys": ["k3"]}]
    assert parse_state(data) == state
    assert "lost" not in parse_state(_state()).to_dict()  # none skipped: the field is left out


def test_the_same_settings_are_accepted() -> None:
    _check(_state(), seed=3, rank=0, world=1, batch_size=16, shards=SHARDS)
    _check(_state(), seed=3, rank=0, world=1)  # keywords left out are not compared


def test_another_batch_size_is_refused_naming_both() -> None:
    with pytest.raises(UserError, match="batch size 16 in the state vs 32 here"):
        _check(_state(), seed=3, rank=0, world=1, batch_size=32, shards=SHARDS)


@pytest.mark.parametrize("paths,sizes", [(["a.tar"], [100]), (["b.tar", "a.tar"], [52, 100]),
                                         (["a.tar", "b.tar"], [100, 51]), (["a.tar", "b.tar", "c.tar"], [100, 52, 9])])
def test_another_shard_set_is_refused(paths: list[str], sizes: list[int]) -> None:
    with pytest.raises(UserError, match="another shard set"):
        _check(_state(), seed=3, rank=0, world=1, shards=shard_set_digest(paths, sizes))


def test_every_difference_is_listed() -> None:
    with pytest.raises(UserError) as info:
        _check(_state(spec="x"), seed=4, rank=0, world=1, batch_size=8, shards="other", spec="y")
    text = str(info.value)
    assert "seed" in text and "batch size" in text and "shard set" in text and "another spec" in text


def test_a_version_1_state_still_loads() -> None:
    """The flat state of earlier feedfast: ``dali`` is the checkpoint text itself, taken at ``step``."""
    old = {"version": 1, "epoch": 1, "step": 3, "seed": 3, "rank": 0, "world_size": 1, "backend": "dali",
           "batch_size": 16, "shards": SHARDS, "spec": "s", "dali": encode_checkpoint("cpt"), "partition": "shards",
           "consumed": 0, "tuned": {"threads": 2, "prefetch": 4}, "stats": {**STATS, "converted": 1}}
    parsed = parse_state(old)
    assert parsed.resume == ResumePoint(1, 3, 0, "cpt", 3) and parsed.backend == "dali"
    assert parsed.tuner == {"threads": 2, "prefetch": 4} and parsed.stats == STATS
    older = {k: v for k, v in old.items() if k not in ("batch_size", "shards", "backend", "partition", "consumed",
                                                        "spec", "tuned", "dali")}
    parsed = parse_state(older)  # from before these keys were recorded: not compared
    parsed.check_matches(seed=3, rank=0, world=1, batch_size=32, shards="other")
    assert parsed.backend == "threads" and parsed.resume == ResumePoint(1, 3, 0, None, 3)


def test_not_a_state_is_refused() -> None:
    for bad in (None, [], "state", {"version": 99}, {"version": True}, {"version": STATE_VERSION}, {}):
        with pytest.raises(UserError) as info:
            parse_state(bad)
        assert "\n" not in str(info.value)


TAMPERED = [  # (change, the field the message must name)
    ({"step": -5}, "'step'"),
    ({"step": "3"}, "'step'"),
    ({"step": 3.0}, "'step'"),
    ({"step": True}, "'step'"),
    ({"epoch": -1}, "'epoch'"),
    ({"consumed": -7}, "'consumed'"),
    ({"consumed": 5}, "'consumed'"),  # outside the global order
    ({"seed": None}, "'seed'"),
    ({"rank": 1}, "'rank'"),  # rank >= world_size
    ({"world_size": 0}, "'world_size'"),
    ({"batch_size": 0}, "'batch_size'"),
    ({"partition": "sorted"}, "'partition'"),
    ({"shards": 7}, "'shards'"),
    ({"backend": "torch"}, "'backend'"),
    ({"stats": None}, "'stats'"),
    ({"stats": {"delivered": "12"}}, "'stats.delivered'"),
    ({"stats": {**STATS, "delivered": -1}}, "'stats.delivered'"),
    ({"stats": {k: v for k, v in STATS.items() if k != "padded"}}, "'stats.padded'"),
    ({"stats": {**STATS, "extra": 1}}, "'stats.extra'"),
    ({"tuned": {"threads": 0, "prefetch": 2}}, "'tuned.threads'"),
    ({"tuned": "fast"}, "'tuned'"),
    ({"backend": "dali", "dali": {"checkpoint": "not base64!", "step": 0}}, "'dali.checkpoint'"),
    ({"backend": "dali", "dali": {"checkpoint": "QUJD", "step": 4}}, "'dali.step'"),  # after the state's step
    ({"backend": "dali", "dali": {"checkpoint": None, "step": 0}}, "'dali.checkpoint'"),
    ({"backend": "dali", "dali": "QUJD"}, "'dali'"),
    ({"dali": {"checkpoint": "QUJD", "step": 0}}, "'dali'"),  # a checkpoint for the threaded backend
    ({"backend": "dali", "dali": {"checkpoint": encode_checkpoint("feedfast-rescue/1\n{not json"), "step": 0}},
     "'dali.checkpoint'"),
    ({"lost": {"shard": "a.tar"}}, "'lost'"),
    ({"lost": [{"shard": "a.tar", "reason": "gone", "keys": [1]}]}, "'lost[0].keys'"),
    ({"lost": [{"shard": None, "reason": "gone", "keys": []}]}, "'lost[0].shard'"),
    ({"lost": [{"shard": "a.tar", "keys": []}]}, "'lost[0].reason'"),
    ({"lost": [{"shard": "a.tar", "reason": "gone", "keys": [], "more": 1}]}, "'lost[0].more'"),
    ({"surprise": 1}, "'surprise'"),
]


@pytest.mark.parametrize(("change", "field"), TAMPERED, ids=[str(c) for c, _ in TAMPERED])
def test_a_tampered_field_is_refused_in_one_line_naming_it(change: dict[str, Any], field: str) -> None:
    with pytest.raises(UserError) as info:
        parse_state(_state(**change))
    assert field in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("key", sorted(_state()))
def test_a_truncated_state_is_refused_naming_the_missing_field(key: str) -> None:
    state = _state()
    del state[key]
    with pytest.raises(UserError, match=f"'{key}'|version"):
        parse_state(state)


def test_spec_digest_ignores_batch_size_only() -> None:
    from feedfast.spec.load import load_spec

    spec = load_spec(SMALL_SPEC)
    assert spec_digest(spec.to_dict()) == spec_digest(spec.replace(batch_size=99).to_dict())
    assert spec_digest(spec.to_dict()) != spec_digest(spec.replace(seed=99).to_dict())


# ---------------------------------------------------------------------------- against a loader
def _loader(shards: list[str], **kw: Any) -> feedfast.DataLoader:
    kw.setdefault("shuffle", True)
    return feedfast.DataLoader(copy.deepcopy(SMALL_SPEC), shards=shards, num_workers=1, **kw)


def _mid_state(shards: list[str], steps: int = 2, **kw: Any) -> dict[str, Any]:
    loader = _loader(shards, **kw)
    it = iter(loader)
    for _ in range(steps):
        next(it)
    state = loader.state_dict()
    loader.close()
    return json.loads(json.dumps(state))


@pytest.mark.parametrize(("shuffle", "change", "field"), [
    (False, {"step": -5}, "'step'"), (False, {"step": 6}, "'step'"), (False, {"step": 20}, "'step'"),
    (True, {"consumed": -7}, "'consumed'"), (True, {"consumed": 23}, "'consumed'"), (True, {"epoch": -1}, "'epoch'"),
    (True, {"stats": {"delivered": 1}}, "'stats."), (False, {"epoch": "1"}, "'epoch'")])
def test_a_loader_refuses_a_state_outside_its_epoch_and_stays_as_it_was(shards: list[str], shuffle: bool,
                                                                       change: dict[str, Any], field: str) -> None:
    """step=-5 once gave 20 samples of a 10-sample epoch, consumed=-7 a raw IndexError, stats crashed mid-epoch.

    (Under the global order, ``shuffle=True``, the cursor is ``consumed``; in file order, ``step``.)
    """
    state = {**_mid_state(shards, shuffle=shuffle), **change}
    loader = _loader(shards, shuffle=shuffle)
    before = [keys for keys in _epoch_keys(_loader(shards, shuffle=shuffle))]
    with pytest.raises(UserError) as info:
        loader.load_state_dict(state)
    assert field in str(info.value) and "\n" not in str(info.value)
    assert _epoch_keys(loader) == before and loader.stats()["batches"] == 6  # nothing was half-applied


def _epoch_keys(loader: feedfast.DataLoader) -> list[list[str]]:
    keys = []
    for _ in loader:
        keys.append([k for _, k in loader.last_origins[: loader.last_valid]])
    loader.close()
    return keys


_REFERENCE: dict[int, list[str]] = {}


def _reference(shards: list[str], epoch: int) -> list[str]:
    """The epoch's samples in order, uninterrupted."""
    if epoch not in _REFERENCE:
        loader = _loader(shards)
        loader.set_epoch(epoch)
        _REFERENCE[epoch] = [k for keys in _epoch_keys(loader) for k in keys]
    return _REFERENCE[epoch]


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-30, 40), st.floats(allow_nan=False),
                    st.text(max_size=8), st.lists(st.integers(0, 3), max_size=2),
                    st.dictionaries(st.sampled_from(["threads", "prefetch", "checkpoint", "step", "delivered"]),
                                    st.integers(-2, 5), max_size=2))
_DELETE = object()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_changed_state_is_refused_clearly_or_resumes_exactly(shards: list[str], data: st.DataObject) -> None:
    """Any one field (or one field of ``stats``) replaced or removed: a one-line UserError, or the rest of the
    epoch the state points at, each sample once."""
    state = _mid_state(shards, steps=data.draw(st.integers(1, 5), label="steps"))
    keys = sorted(state) + [f"stats.{k}" for k in sorted(state["stats"])]
    cursor = st.tuples(st.sampled_from(["epoch", "step", "consumed", "stats.batches"]), st.integers(-3, 30))
    anything = st.tuples(st.sampled_from(keys), st.one_of(st.integers(-3, 30), st.just(_DELETE), _VALUES))
    key, value = data.draw(st.one_of(cursor, anything), label="field, value")
    where, name = (state["stats"], key[6:]) if key.startswith("stats.") else (state, key)
    if value is _DELETE:
        del where[name]
    else:
        where[name] = value
    loader = _loader(shards)
    try:
        loader.load_state_dict(state)
    except UserError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
        event("refused")
        return
    event("resumed")
    rest = [k for keys in _epoch_keys(loader) for k in keys]
    whole = _reference(shards, state["epoch"])
    point = len(whole) - len(rest)
    assert rest == whole[point:], "the resumed run is not the rest of the epoch"
    assert point in (state["step"] * 4, state.get("consumed")), (point, state)


def _dali_state(shards: list[str]) -> dict[str, Any]:
    return _mid_state(shards, steps=2, shuffle=False, backend="dali", sample_info=True)


def _with_checkpoint(state: dict[str, Any], change: Any) -> dict[str, Any]:
    """The state with ``change`` made to DALI's own checkpoint (inside feedfast's wrapper, where it is wrapped)."""
    import json

    from feedfast.loader.backends.dali.rescue import unwrap_checkpoint
    from feedfast.loader.state import decode_checkpoint

    changed = copy.deepcopy(state)
    text = decode_checkpoint(state["dali"]["checkpoint"])
    inner, _, _ = unwrap_checkpoint(text)
    if inner is not None and inner != text:  # the wrapper is JSON: the inner checkpoint is changed as DALI's
        head, _, body = text.partition("\n")
        wrapper = json.loads(body)
        wrapper["dali"] = change(inner)
        text = head + "\n" + json.dumps(wrapper)
    else:
        text = change(text)
    changed["dali"]["checkpoint"] = encode_checkpoint(text)
    return changed


def _resize_renamed(text: str) -> str:
    """The checkpoint with its resize operator's number changed to nines (the same length: the protobuf stays whole)."""
    import re

    return re.sub(r"__Resize_(\d+)", lambda m: "__Resize_" + "9" * len(m.group(1)), text)


@pytest.mark.parametrize(("change", "says"), [
    (_resize_renamed, "; it has __Resize_9"),
    (lambda text: text[: len(text) // 2], "damaged protobuf"),
    (lambda text: "not a checkpoint at all", "damaged protobuf"),
    (lambda text: "", "no operator")])
def test_a_dali_checkpoint_this_pipeline_cannot_restore_is_refused_naming_the_field(
        shards: list[str], change: Any, says: str) -> None:
    """A checkpoint of another pipeline (or none) once failed inside DALI, on the producer thread mid-epoch."""
    state = _dali_state(shards)
    loader = _loader(shards, shuffle=False, backend="dali")
    with pytest.raises(UserError) as info:
        loader.load_state_dict(_with_checkpoint(state, change))
    message = str(info.value)
    assert "'dali.checkpoint'" in message and says in message and "\n" not in message
    loader.load_state_dict(state)  # the genuine one resumes
    assert len(list(loader)) == 4
    loader.close()


@pytest.mark.parametrize("key", ["shards", "spec"])
def test_a_digest_with_a_line_break_is_refused_on_one_line(shards: list[str], key: str) -> None:
    """A state's digest is shown as the string it is (hypothesis found ``"shards": "\\n"`` broke the message's line)."""
    state = _mid_state(shards, steps=1)
    state[key] = "\n"
    with pytest.raises(UserError, match="cannot resume") as err:
        _loader(shards).load_state_dict(state)
    assert "\n" not in str(err.value) and "'\\n'" in str(err.value)
