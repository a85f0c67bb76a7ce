"""Repeated augmentation (feedfast.order.repeats, ``shuffle.repeats``): exact across ranks, own draws per copy,
resumable and elastic; the multi-rank run uses real gloo processes on 127.0.0.1."""

from __future__ import annotations

import copy
import hashlib
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import feedfast
from feedfast.errors import SpecError, UserError
from feedfast.order.deal import rank_counts, rank_position_of
from feedfast.order.permute import Permutation, key_for
from feedfast.order.repeats import draw_ids, entry_of, repeated
from tests.helpers import ROOT, SMALL_SPEC, free_port, rank_report, spawn_ranks


def _spec(repeats: int = 3) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["shuffle"] = {"buffer": 64, "repeats": repeats}
    return spec


@pytest.mark.parametrize("total,world,batch", [(23, 3, 4), (40, 2, 4), (17, 4, 1), (9, 1, 2), (50, 8, 3)])
def test_entries_are_a_bijection_and_rank_r_reads_the_entries_r_mod_world(total: int, world: int, batch: int) -> None:
    entries = entry_of(np.arange(total), total, world=world, batch_size=batch)
    assert sorted(entries.tolist()) == list(range(total))
    full = total // (world * batch) * world * batch
    for r in range(world):
        rows = np.arange(rank_counts(total, world=world, batch_size=batch)[r])
        mine = entries[rank_position_of(rows, total, rank=r, world=world, batch_size=batch)]
        body = mine[mine < full]
        assert (body % world == r).all() and (np.diff(body) > 0).all()  # RASampler's indices[r::world], in order


@pytest.mark.parametrize("repeats,world", [(3, 3), (3, 8), (2, 4), (4, 2)])
def test_a_samples_copies_go_to_different_ranks_where_the_world_allows(repeats: int, world: int) -> None:
    total, batch = 96, 2
    perm = Permutation(total, key_for("t", 0))
    owner: dict[int, list[int]] = {}
    for r in range(world):
        rows = np.arange(rank_counts(total, world=world, batch_size=batch)[r])
        entries = entry_of(rank_position_of(rows, total, rank=r, world=world, batch_size=batch), total,
                           world=world, batch_size=batch)
        for s in repeated(entries, perm, repeats)[0].tolist():
            owner.setdefault(s, []).append(r)
    for ranks in owner.values():
        spread = min(repeats, world)
        assert len(set(ranks)) >= min(len(ranks), spread)
    assert sum(map(len, owner.values())) == total and max(map(len, owner.values())) == repeats


def test_copy_zero_draws_as_the_sample_and_each_copy_its_own() -> None:
    ids = draw_ids(np.array([5, 5, 5]), np.array([0, 1, 2]), 23)
    assert ids.tolist() == [5, 28, 51]


def _epoch(loader: feedfast.DataLoader) -> list[tuple[str, str]]:
    out = []
    for images, _ in loader:
        for i, (_, key) in enumerate(loader.last_origins[: loader.last_valid]):
            out.append((key, hashlib.sha1(images[i].numpy().tobytes()).hexdigest()))
    return out


@pytest.mark.parametrize("backend", ["threads", "pil", "dali"])
def test_every_copy_once_with_its_own_augmentation(shards: list[str], backend: str) -> None:
    seen = []
    for r in range(3):
        loader = feedfast.DataLoader(_spec(), shards=shards, rank=r, world_size=3, backend=backend, num_workers=1)
        assert len(loader) == 2  # the epoch keeps the dataset's length: 23 samples over 3 ranks in batches of 4
        seen += _epoch(loader)
    keys = Counter(k for k, _ in seen)
    assert sum(keys.values()) == 23 and max(keys.values()) == 3 and len(keys) == 8
    for key in keys:  # the copies of a sample are augmented apart (the crop is drawn per copy)
        pixels = [h for k, h in seen if k == key]
        assert len(set(pixels)) == len(pixels)


def test_no_repeats_is_todays_order(shards: list[str]) -> None:
    plain = copy.deepcopy(_spec())
    plain["shuffle"].pop("repeats")
    a = _epoch(feedfast.DataLoader(plain, shards=shards, backend="threads", num_workers=1))
    b = _epoch(feedfast.DataLoader(_spec(1), shards=shards, backend="threads", num_workers=1))
    assert a == b and len({k for k, _ in a}) == 23


def test_resume_mid_epoch_and_elastic(shards: list[str]) -> None:
    whole = _epoch(feedfast.DataLoader(_spec(), shards=shards, backend="threads", num_workers=1, batch_size=2))
    first = feedfast.DataLoader(_spec(), shards=shards, backend="threads", num_workers=1, batch_size=2)
    got, it = [], iter(first)
    for _ in range(3):
        images, _ = next(it)
        got += [k for _, k in first.last_origins[: first.last_valid]]
    state = first.state_dict()
    resumed = feedfast.DataLoader(_spec(), shards=shards, backend="threads", num_workers=1, batch_size=2)
    resumed.load_state_dict(state)
    assert _epoch(resumed) == whole[6:]  # the same copies with the same pixels
    # elastic: the rest of the epoch at 2 ranks, batch 3: every remaining (sample, copy) once, pixels included
    rest = []
    for r in range(2):
        loader = feedfast.DataLoader(_spec(), shards=shards, backend="threads", num_workers=1, batch_size=3, rank=r,
                                     world_size=2)
        loader.load_state_dict(state)
        rest += _epoch(loader)
    assert Counter(rest) == Counter(whole[6:])


def test_bad_repeats_are_named(shards: list[str]) -> None:
    for value in (0, 1.5, True, 100):
        spec = _spec()
        spec["shuffle"]["repeats"] = value
        with pytest.raises(SpecError, match="shuffle.repeats"):
            feedfast.load_spec(spec)
    unshuffled = copy.deepcopy(SMALL_SPEC)
    unshuffled["shuffle"] = {"repeats": 3}
    with pytest.raises(SpecError, match="needs a shuffled epoch"):
        feedfast.load_spec(unshuffled)
    with pytest.raises(UserError, match="needs the global order"):
        feedfast.DataLoader(_spec(), shards=shards, shuffle=False, backend="threads")


def _run_rank(rank: int, world: int, port: int, shards: list[str], out: str) -> None:
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    rank_report(out, rank, lambda: _rank_epochs(rank, world, port, shards))


def _rank_epochs(rank: int, world: int, port: int, shards: list[str]) -> dict[str, Any]:
    import torch.distributed as dist

    import feedfast

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        loader = feedfast.DataLoader(_spec(), shards=shards, num_workers=1, backend="threads", batch_size=2)
        epochs = [{"len": len(loader), "seen": _epoch(loader)} for _ in range(2)]
        loader.close()
    finally:
        dist.destroy_process_group()
    return {"epochs": epochs, "world": loader.world}


@pytest.mark.slow
def test_three_gloo_ranks_each_copy_once_on_different_ranks(shards: list[str], tmp_path: Path) -> None:
    port = free_port()
    reports = spawn_ranks(_run_rank, 3, tmp_path, lambda r: (r, 3, port, shards, str(tmp_path)), timeout_s=180)
    assert [rep["world"] for rep in reports] == [3, 3, 3]
    for e in range(2):
        assert len({rep["epochs"][e]["len"] for rep in reports}) == 1
        everything = [(r, k, h) for r, rep in enumerate(reports) for k, h in rep["epochs"][e]["seen"]]
        assert len(everything) == 23 and len({(k, h) for _, k, h in everything}) == 23  # no copy twice
        by_key: dict[str, set[int]] = {}
        for r, k, _ in everything:
            by_key.setdefault(k, set()).add(r)
        counts = Counter(k for _, k, _ in everything)
        assert all(len(by_key[k]) == counts[k] for k in counts)  # 3 copies on 3 ranks: never two on one rank
    firsts = [{k for k, _ in rep["epochs"][0]["seen"]} for rep in reports]
    seconds = [{k for k, _ in rep["epochs"][1]["seen"]} for rep in reports]
    assert firsts != seconds  # a new permutation each epoch


def test_spec_prints_repeats_back_and_plan_shows_it(tmp_path: Path) -> None:
    import subprocess

    import yaml

    spec = feedfast.load_spec(_spec())
    assert spec.repeats == 3 and feedfast.load_spec(spec.to_dict()).repeats == 3
    assert "repeats" not in feedfast.load_spec(SMALL_SPEC).to_dict()["shuffle"]
    path = tmp_path / "ra.yaml"
    path.write_text(yaml.safe_dump(spec.to_dict()))
    out = subprocess.run([sys.executable, "-m", "feedfast", "plan", str(path), "--device", "cpu"],
                         capture_output=True, text=True, check=True).stdout
    assert "repeats: each sample 3 times an epoch" in out
