"""torch DataLoader arguments with torch's meaning, re-iteration as in torch, and batches that carry their identity."""

from __future__ import annotations

import copy
import json
import time
from typing import Any, Iterator

import pytest
import torch

import feedfast
from feedfast.errors import FeedfastError, UserError
from feedfast.loader.batch import BatchInfo


def _loader(spec: dict, shards: list[str], **kw: Any) -> feedfast.DataLoader:
    kw.setdefault("num_workers", 2)
    return feedfast.DataLoader(spec, shards=shards, **kw)


def test_timeout_zero_is_torchs_default_and_a_positive_timeout_bounds_the_wait(
        small_spec: dict, shards: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert sum(1 for _ in _loader(small_spec, shards, timeout=0)) == 6
    with pytest.raises(UserError, match="timeout must be"):
        _loader(small_spec, shards, timeout=-1)
    loader = _loader(small_spec, shards, timeout=0.2)
    real = loader._backend.batches

    def stalled(*args: Any) -> Iterator[Any]:
        for i, batch in enumerate(real(*args)):
            if i == 2:
                time.sleep(1.5)  # a read that hangs
            yield batch

    monkeypatch.setattr(loader._backend, "batches", stalled)
    it = iter(loader)
    next(it), next(it)
    with pytest.raises(FeedfastError, match="no batch within timeout=0.2 s"):
        next(it)
    loader.close()


def test_drop_last_false_wins_over_a_spec_that_drops(small_spec: dict, shards: list[str]) -> None:
    small_spec["batch"] = {"size": 4, "last_batch": "drop"}
    assert len(_loader(small_spec, shards)) == 5  # 23 samples: the spec drops the last 3
    kept = _loader(small_spec, shards, drop_last=False)
    assert kept.spec.last_batch == "partial" and len(kept) == 6
    assert [x.shape[0] for x, _ in kept] == [4, 4, 4, 4, 4, 3]


def test_pin_memory_device_names_the_pinned_device_and_never_moves_batches(small_spec: dict,
                                                                            shards: list[str]) -> None:
    loader = _loader(small_spec, shards, pin_memory_device="")
    assert loader.device.type == "cpu"
    with pytest.raises(UserError, match="pins staging memory for the device batches are delivered to"):
        _loader(small_spec, shards, pin_memory_device="cuda")


def test_a_new_iterator_runs_the_next_epoch_and_the_old_one_says_so(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, shuffle=True)
    epochs = [[list(loader.last_origins) for _ in loader] for _ in range(2)]
    loader.set_epoch(0)
    first = iter(loader)
    next(first), next(first)
    second = iter(loader)  # the stopped epoch ends: the next one, in its own order (torch's iterators draw anew)
    assert [list(loader.last_origins) for _ in second] == epochs[1]
    with pytest.raises(FeedfastError, match="a newer iter\\(loader\\) or close\\(\\) ended its epoch"):
        next(first)


def test_each_batch_carries_its_origins_padding_and_resume_state(small_spec: dict, shards: list[str]) -> None:
    small_spec["batch"] = {"size": 4, "last_batch": "pad"}
    loader = _loader(small_spec, shards, shuffle=True, sample_info=True)
    batches = list(loader)
    infos = [info for _, _, info in batches]
    assert all(isinstance(i, BatchInfo) for i in infos)
    assert [i.step for i in infos] == list(range(6)) and {i.epoch for i in infos} == {0}
    keys = [k for i in infos for k, ok in zip(i.keys, i.valid.tolist()) if ok]
    assert len(keys) == len(set(keys)) == 23  # every sample once, the padding marked
    assert infos[-1].valid.tolist() == [True, True, True, False]
    assert infos[-1].origins[3] == infos[-1].origins[2]  # padding repeats the last sample
    small_spec["outputs"] = {"image": "image", "label": "label"}
    batch = next(iter(_loader(small_spec, shards, sample_info=True)))
    assert isinstance(batch["sample_info"], BatchInfo) and len(batch["sample_info"].keys) == 4


@pytest.mark.parametrize("backend", ["dali", "threads"])
def test_a_consumer_two_batches_ahead_resumes_from_the_batch_in_hand(small_spec: dict, shards: list[str],
                                                                      backend: str) -> None:
    """A prefetching wrapper holds batches ahead of the one it trains on; the batch's own state is the right one."""
    spec = copy.deepcopy(small_spec)
    full = [(x.clone(), info.keys) for x, _, info in _loader(spec, shards, shuffle=True, sample_info=True,
                                                             backend=backend)]
    loader = _loader(spec, shards, shuffle=True, sample_info=True, backend=backend)
    it = iter(loader)
    window = [next(it), next(it), next(it)]  # the wrapper fetched two ahead of the one in hand
    in_hand = window[0]
    state = json.loads(json.dumps(in_hand[2].state))
    assert state["step"] == 1 and loader.state_dict()["step"] == 3  # the loader's own state is further on
    loader.close()
    resumed = _loader(spec, shards, shuffle=True, sample_info=True, backend=backend)
    resumed.load_state_dict(state)
    rest = [(x, info.keys) for x, _, info in resumed]
    assert [k for _, k in rest] == [k for _, k in full[1:]]
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(rest, full[1:]))


def test_a_state_from_another_batch_size_is_refused_without_the_global_order(small_spec: dict,
                                                                             shards: list[str]) -> None:
    loader = _loader(small_spec, shards, shuffle=False)  # contiguous ranges: a step points at samples
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state["partition"] == "shards"
    with pytest.raises(UserError, match="batch size 4 in the state vs 8 here"):
        _loader(small_spec, shards, shuffle=False, batch_size=8).load_state_dict(state)
    with pytest.raises(UserError, match="taken with backend='threads' and this loader uses 'dali'"):
        _loader(small_spec, shards, shuffle=False, backend="dali").load_state_dict(state)
    shuffled = _loader(small_spec, shards, shuffle=True)
    it = iter(shuffled)
    next(it), next(it)
    elastic = shuffled.state_dict()
    assert elastic["partition"] == "global" and elastic["consumed"] == 8
    _loader(small_spec, shards, shuffle=True, batch_size=8).load_state_dict(elastic)  # a cursor: any batch size


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "5", True])
def test_remote_timeout_must_be_seconds_above_zero(small_spec: dict, shards: list[str], value: Any) -> None:
    with pytest.raises(UserError, match=rf"remote_timeout must be a number of seconds > 0, got {value!r}"):
        _loader(small_spec, shards, remote_timeout=value)


def test_remote_timeout_and_retries_set_the_transfer_of_remote_reads(small_spec: dict, shards: list[str]) -> None:
    default = _loader(small_spec, shards).settings.open_kw["transfer"]
    assert (default.deadline, default.timeout, default.retries) == (60.0, 30.0, 3)
    given = _loader(small_spec, shards, remote_timeout=2, remote_retries=0).settings.open_kw["transfer"]
    assert (given.deadline, given.timeout, given.retries) == (2.0, 2.0, 0)  # a socket read waits no longer either
    assert (given.backoff, given.min_rate) == (default.backoff, default.min_rate)


def test_a_trickling_server_fails_within_the_loaders_remote_timeout(small_spec: dict, local: list[str],
                                                                     server: Any) -> None:
    from feedfast.shards.transport.remote import RemoteError

    urls = server.urls(local)
    loader = _loader(small_spec, urls, remote_timeout=0.3, remote_retries=0, backend="threads")
    server.trickle_every = 0.05
    server.faults["/train-0000.tar"] = ["trickle"] * 100  # every request of the first shard, from now on
    started = time.monotonic()
    with pytest.raises(RemoteError, match=rf"shard '{urls[0]}'"):
        for _ in loader:
            pass
    assert time.monotonic() - started < 10  # the default deadline would wait 60 s a request
    loader.close()
