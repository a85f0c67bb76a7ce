"""The shard cache: a shard evicted that cannot be fetched again is named, with the URL, never a bare failure."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import feedfast
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import RemoteError, Transfer
from tests.helpers import keys_of_epoch
from tests.rangeserver import RangeServer

FAST = Transfer(timeout=5.0, retries=1, backoff=0.01)


def _stop_serving(server: RangeServer, url: str) -> None:
    server.faults[url[len(server.url):]] = [503] * 1000


def _epoch(loader: feedfast.DataLoader) -> int:
    return sum(loader.last_valid for _ in loader)


def test_an_evicted_shard_that_cannot_be_fetched_again_is_named_with_its_url(
        local: list[str], server: RangeServer, tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "shards"), limit=int(1.5 * os.path.getsize(local[0])), transfer=FAST)
    urls = server.urls(local[:2])
    cache.ensure(urls[0])
    cache.ensure(urls[1])  # evicts the first
    assert not cache.path_for(urls[0]).exists()
    _stop_serving(server, urls[0])
    with pytest.raises(RemoteError, match=rf"shard {re.escape(repr(urls[0]))} was evicted from the shard cache "
                                          r".*cannot be fetched again: .*HTTP 503") as err:
        cache.read_range(urls[0], 0, 512)
    assert err.value.url == urls[0] and err.value.status == 503
    with pytest.raises(RemoteError, match=r"HTTP 404") as first:  # never cached: the plain failure
        cache.ensure(f"{server.url}/absent.tar")
    assert "evicted" not in str(first.value)
    with pytest.raises(RemoteError) as again:  # a second failed first download (its lock file left): still plain
        cache.ensure(f"{server.url}/absent.tar")
    assert "evicted" not in str(again.value)


def test_a_pipe_shard_evicted_mid_epoch_whose_command_fails_again_is_an_error_naming_it(
        small_spec: dict, local: list[str], tmp_path: Path) -> None:
    mark = tmp_path / "served"
    once = f"pipe:test -e {mark} && exit 1; touch {mark}; cat {local[0]}"  # serves its shard once
    shards = [once] + [f"pipe:cat {p}" for p in local[1:]]
    loader = feedfast.DataLoader(small_spec, shards=shards, cache_dir=tmp_path / "c", backend="threads",
                                 cache_limit=2 * os.path.getsize(local[0]), remote_retries=0)
    with pytest.raises(RemoteError, match=rf"{re.escape(repr(once))}.*was evicted from the shard cache.*cannot be "
                                          r"fetched again: shard command failed \(exit 1\)"):
        _epoch(loader)
    loader.close()


@pytest.mark.parametrize("backend,workers", [("threads", None), ("pil", 0), ("pil", 2), ("dali", None)])
def test_under_skip_an_evicted_http_shard_that_cannot_be_fetched_again_is_a_counted_skip(
        small_spec: dict, local: list[str], server: RangeServer, tmp_path: Path, backend: str,
        workers: int | None) -> None:
    urls = server.urls(local)
    whole = keys_of_epoch(feedfast.DataLoader(small_spec, shards=local, backend=backend, num_workers=workers))
    loader = feedfast.DataLoader(small_spec, shards=urls, on_error="skip", cache_dir=tmp_path / "c",
                                 backend=backend, num_workers=workers, cache_limit=2 * os.path.getsize(local[0]),
                                 remote_retries=0)
    _stop_serving(server, urls[0])  # opened (downloaded, checked, evicted): now gone from the source
    keys = keys_of_epoch(loader)
    skipped: list[dict[str, Any]] = loader.skipped_samples()
    lost = {s["key"] for s in skipped}
    assert len(keys) == 18 and len(lost) == 5 and {s["shard"] for s in skipped} == {urls[0]}
    assert sorted(keys) == sorted(set(whole) - lost)  # every other sample once
    assert keys == [k for k in whole if k not in lost]  # in the epoch's own order, the lost ones taken out
    assert all("was evicted from the shard cache" in s["reason"] for s in skipped)
    stats = loader.stats()
    assert stats["skipped"] == 5 and stats["delivered"] == 18 and stats["padded"] == 5  # the lost rows, filled
    server.faults.clear()  # served again: the next epoch reads it
    assert sorted(keys_of_epoch(loader)) == sorted(whole) and loader.stats()["skipped"] == 5
    loader.close()


@pytest.mark.parametrize("backend", ["threads", "pil", "dali"])
def test_a_batch_whose_every_row_is_lost_is_padding_and_later_ones_are_filled_from_their_samples(
        small_spec: dict, local: list[str], server: RangeServer, tmp_path: Path, backend: str) -> None:
    urls = server.urls(local)
    spec = {**small_spec, "shuffle": False}
    loader = feedfast.DataLoader(spec, shards=urls, on_error="skip", cache_dir=tmp_path / "c", backend=backend,
                                 cache_limit=2 * os.path.getsize(local[0]), remote_retries=0, sample_info=True)
    _stop_serving(server, urls[0])
    batches = list(loader)
    first, second = batches[0], batches[1]  # shard 0's 5 samples: all of the first batch, one of the second
    assert not first[2].valid.any()
    if backend == "dali":  # DALI decodes every row: copies of a sample of a shard that can be read (each cropped)
        assert first[0].any() and len(set(first[1].tolist())) == 1
    else:  # before any sample of the epoch was made: zeros, a label 0
        assert not first[0].any() and first[1].tolist() == [0, 0, 0, 0]
    assert second[2].valid.tolist() == [True, True, True, False]
    assert second[1][3] == second[1][0] and second[2].keys[3] == first[2].keys[0][:-1] + "4"  # its own name
    assert torch.equal(second[0][3], second[0][0]) or backend == "dali"  # DALI crops the copy apart
    assert loader.stats()["skipped"] == 5 and loader.stats()["delivered"] == 18
    loader.close()


@pytest.mark.parametrize("backend", ["threads", "dali"])
def test_a_resumed_loader_names_the_samples_the_interrupted_one_skipped_mid_epoch(
        small_spec: dict, local: list[str], server: RangeServer, tmp_path: Path, backend: str) -> None:
    urls = server.urls(local)
    spec = {**small_spec, "shuffle": False}

    def loader() -> feedfast.DataLoader:
        return feedfast.DataLoader(spec, shards=urls, on_error="skip", cache_dir=tmp_path / "c", backend=backend,
                                   cache_limit=2 * os.path.getsize(local[0]), remote_retries=0)

    first = loader()
    _stop_serving(server, urls[0])
    it = iter(first)
    kept = [next(it) and first.last_valid for _ in range(3)]  # shard 0's 5 samples are in the first 2 batches
    state = first.state_dict()
    first.close()
    assert kept == [0, 3, 4] and len(state["lost"]) == 1 and len(state["lost"][0]["keys"]) == 5
    server.faults.clear()  # served while the dataset is opened again (else the shard set differs)
    resumed = loader()
    _stop_serving(server, urls[0])
    resumed.load_state_dict(state)
    rest = _epoch(resumed)
    assert rest == 11 and resumed.stats()["skipped"] == 5 and resumed.stats()["delivered"] == 18
    assert [s["key"] for s in resumed.skipped_samples()] == state["lost"][0]["keys"]
    assert all("was evicted from the shard cache" in s["reason"] for s in resumed.skipped_samples())
    resumed.close()
