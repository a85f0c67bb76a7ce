"""Multi-rank loading with real gloo processes on 127.0.0.1: each sample once, equal steps."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from feedfast.order.deal import plan_epoch
from feedfast.shards.index.tarindex import scan_tar
from tests.helpers import ROOT, SMALL_SPEC, free_port, make_shards, rank_report, spawn_ranks

POLICIES = ("partial", "pad", "drop")
EPOCHS = 2
JOIN_TIMEOUT_S = 120
pytestmark = pytest.mark.slow  # two spawns of 2 and 3 processes that import DALI and torch


def _run_rank(rank: int, world: int, port: int, datasets: dict[str, list[str]], out: str) -> None:
    """One rank: every dataset under every policy for two epochs; results as JSON in ``out``."""
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    os.environ.update(RANK="0", WORLD_SIZE="1")  # wrong on purpose: torch.distributed must win
    rank_report(out, rank, lambda: _rank_results(rank, world, port, datasets))


def _rank_results(rank: int, world: int, port: int, datasets: dict[str, list[str]]) -> dict[str, Any]:
    """What one rank saw, per dataset and policy: each epoch's batches, samples, padding and the steps gathered."""
    import torch
    import torch.distributed as dist

    import feedfast

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    try:
        for name, shards in datasets.items():
            for policy in POLICIES:
                loader = feedfast.DataLoader(SMALL_SPEC, shards=shards, batch_size=4, shuffle=True,
                                             num_workers=1, last_batch=policy, seed=7)
                epochs = []
                for _ in range(EPOCHS):
                    epoch, length, before = loader.epoch, len(loader), loader.stats()
                    real, pads, sizes, batches = [], [], [], 0
                    for images, labels in loader:
                        batches += 1
                        sizes.append(int(images.shape[0]))
                        assert int(labels.shape[0]) == len(loader.last_origins)
                        origins = [[Path(s).name, k] for s, k in loader.last_origins]
                        real += origins[: loader.last_valid]
                        pads += origins[loader.last_valid:]
                    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
                    dist.all_gather(counts, torch.tensor([batches], dtype=torch.int64))
                    after = loader.stats()
                    epochs.append({
                        "epoch": epoch, "len": length, "batches": batches, "sizes": sizes, "real": real,
                        "pads": pads, "gathered": [int(c.item()) for c in counts],
                        "padded": after["padded"] - before["padded"],
                        "dropped": after["dropped"] - before["dropped"],
                        "sizes_per_shard": list(loader.shards.sizes), "rank": loader.rank,
                        "world": loader.world,
                    })
                loader.close()
                results[f"{name}/{policy}"] = epochs
    finally:
        dist.destroy_process_group()
    return results


def _spawn(world: int, datasets: dict[str, list[str]], out: Path) -> list[dict[str, Any]]:
    """Run ``world`` ranks in fresh processes; fail (not hang) past the join timeout."""
    port = free_port()
    return spawn_ranks(_run_rank, world, out, lambda r: (r, world, port, datasets, str(out)), timeout_s=JOIN_TIMEOUT_S)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """23 samples (5, 5, 5, 5, 3) and 26 samples (5, 5, 5, 5, 5, 1) of real JPEGs."""
    return {
        "n23": make_shards(tmp_path_factory.mktemp("n23"), samples=23, per_shard=5, seed=1),
        "n26": make_shards(tmp_path_factory.mktemp("n26"), samples=26, per_shard=5, seed=2),
    }


def _dataset_keys(shards: list[str]) -> Counter:
    return Counter((Path(p).name, s.key) for p in shards for s in scan_tar(p))


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_split_each_epoch_exactly_with_equal_steps(world: int, datasets: dict[str, list[str]],
                                                         tmp_path: Path) -> None:
    results = _spawn(world, datasets, tmp_path)
    for name, shards in datasets.items():
        everything = _dataset_keys(shards)
        for policy in POLICIES:
            where = f"world {world}, {name}, {policy}"
            runs = [results[r][f"{name}/{policy}"] for r in range(world)]
            sequences = []
            for e in range(EPOCHS):
                per_rank = [runs[r][e] for r in range(world)]
                assert [(x["rank"], x["world"]) for x in per_rank] == [(r, world) for r in range(world)], where
                assert [x["epoch"] for x in per_rank] == [e] * world, where
                plans = [plan_epoch(per_rank[r]["sizes_per_shard"], batch_size=4, rank=r, world=world,
                                    last_batch=policy, epoch=e) for r in range(world)]
                steps = plans[0].steps
                for r, x in enumerate(per_rank):
                    assert x["batches"] == x["len"] == steps, f"{where}, epoch {e}, rank {r}"
                    assert x["gathered"] == [steps] * world, f"{where}, epoch {e}, rank {r}"
                    assert tuple(x["sizes"]) == plans[r].batch_sizes, f"{where}, epoch {e}, rank {r}"
                    assert x["padded"] == len(x["pads"]) == plans[r].padded, f"{where}, epoch {e}, rank {r}"
                    assert x["dropped"] == plans[r].dropped, f"{where}, epoch {e}, rank {r}"
                    real = {tuple(k) for k in x["real"]}
                    assert all(tuple(k) in real for k in x["pads"]), "padding repeats the rank's own samples"
                seen = Counter(tuple(k) for x in per_rank for k in x["real"])
                if policy == "drop":
                    assert max(seen.values()) == 1, f"{where}, epoch {e}: duplicates"
                    assert not seen - everything, f"{where}, epoch {e}: unknown keys"
                    dropped = sum(p.dropped for p in plans)
                    assert sum(seen.values()) == sum(everything.values()) - dropped, f"{where}, epoch {e}"
                else:
                    assert seen == everything, f"{where}, epoch {e}: not every sample exactly once"
                sequences.append([tuple(k) for x in per_rank for k in x["real"]])
            assert sequences[0] != sequences[1], f"{where}: epochs 0 and 1 yield the same order"
