"""One DALI pipeline for the loader's life (feedfast.loader.backends.dali.life): epochs run through it one after
another, an epoch left mid-way or another asked for drops what was fed for it, and a state taken anywhere
resumes what the uninterrupted run delivers, pixels included."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import feedfast
from tests.helpers import keys_of_epoch, labels_of, state_after


def _loader(spec: dict, shards: list[str], **kw: Any) -> feedfast.DataLoader:
    kw.setdefault("num_workers", 1)
    return feedfast.DataLoader(spec, shards=shards, backend="dali", shuffle=True, **kw)


def _epochs(loader: feedfast.DataLoader, count: int) -> list[tuple[torch.Tensor, list[str]]]:
    return [(x.clone(), [k for _, k in loader.last_origins]) for _ in range(count) for x, _ in loader]


@pytest.mark.parametrize(("stop", "sample_info"), [(8, False), (9, False), (13, True), (12, False)])
def test_a_state_taken_in_a_later_epoch_resumes_exactly(small_spec: dict, shards: list[str], stop: int,
                                                        sample_info: bool) -> None:
    """Epochs of 6 batches: a state after ``stop`` batches (in epoch 1 or 2, with DALI's checkpoint of that
    epoch's start or of the batch itself) resumes the rest, pixels too, though the pipeline ran on from epoch 0."""
    whole = _epochs(_loader(small_spec, shards), 3)
    part = _loader(small_spec, shards, sample_info=sample_info)
    state = state_after(part, stop)
    part.close()
    assert state["dali"] is not None  # the epoch's start, or a later batch: never the loader's first build
    resumed = _loader(small_spec, shards, sample_info=sample_info)
    resumed.load_state_dict(state)
    rest = []
    for _ in range(3 - stop // 6):
        rest += [batch[0].clone() for batch in resumed]
    assert len(rest) == len(whole) - stop
    assert all(torch.equal(a, b) for a, (b, _) in zip(rest, whole[stop:]))


def test_another_epoch_asked_for_drops_the_one_started_ahead(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards)
    keys_of_epoch(loader)  # epoch 1 is queued (and running) by its end
    loader.set_epoch(4)
    fresh = _loader(small_spec, shards)
    fresh.set_epoch(4)
    assert keys_of_epoch(loader) == keys_of_epoch(fresh)
    loader.close()
    fresh.close()


def test_an_epoch_left_mid_way_is_dropped_and_the_next_is_whole(small_spec: dict, shards: list[str]) -> None:
    truth = labels_of(shards)
    loader = _loader(small_spec, shards)
    it = iter(loader)
    next(it), next(it)  # DALI has the rest of the epoch in flight
    keys, labels = [], []
    for _, batch_labels in loader:  # the next epoch (torch's rule: a stopped iteration ended its epoch)
        keys += [k for _, k in loader.last_origins[: loader.last_valid]]
        labels += batch_labels[: loader.last_valid].tolist()
    assert loader.epoch == 2 and sorted(keys) == sorted(truth)
    assert labels == [truth[k] for k in keys]  # labels handed over by the feed, not through DALI
    loader.close()


def test_labels_stay_with_their_images_over_epochs(small_spec: dict, shards: list[str]) -> None:
    truth = labels_of(shards)
    loader = _loader(small_spec, shards)
    for _ in range(3):
        for _, labels in loader:
            keys = [k for _, k in loader.last_origins[: loader.last_valid]]
            assert labels[: loader.last_valid].tolist() == [truth[k] for k in keys]
    loader.close()
