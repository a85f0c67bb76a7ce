"""Two ranks in real gloo processes over http shards under the block shuffle: each sample once, equal steps,
and a state taken mid-epoch resumes each rank's remaining batches."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from feedfast.order.deal import plan_epoch
from feedfast.shards.index.tarindex import scan_tar
from tests.helpers import ROOT, SMALL_SPEC, free_port, make_shards, rank_report, spawn_ranks
from tests.rangeserver import RangeServer

WORLD = 2
SPEC = {**SMALL_SPEC, "shuffle": {"buffer": 64, "shards": True, "block": 8, "window": 2}}
POLICIES = ("partial", "drop")
JOIN_TIMEOUT_S = 120
pytestmark = pytest.mark.slow  # two spawned processes that import DALI and torch


def _run_rank(rank: int, port: int, urls: list[str], out: str) -> None:
    """One rank: two epochs per policy, then a resume from the state after the first batch of epoch 0."""
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    rank_report(out, rank, lambda: _rank_results(rank, port, urls))


def _rank_results(rank: int, port: int, urls: list[str]) -> dict[str, Any]:
    """What one rank saw per policy: each epoch's keys, padding and steps gathered, and the resumed batches."""
    import torch
    import torch.distributed as dist

    import feedfast

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    results: dict[str, Any] = {}
    try:
        for policy in POLICIES:
            loader = feedfast.DataLoader(SPEC, shards=urls, batch_size=3, shuffle=True, num_workers=1,
                                         last_batch=policy, seed=5, backend="dali")
            epochs, state = [], None
            for e in range(2):
                keys, pads, sizes = [], [], []
                for i, (images, _) in enumerate(loader):
                    sizes.append(int(images.shape[0]))
                    keys.append([k for _, k in loader.last_origins[: loader.last_valid]])
                    pads += [k for _, k in loader.last_origins[loader.last_valid:]]
                    if e == 0 and i == 0:
                        state = json.loads(json.dumps(loader.state_dict()))
                steps = torch.tensor([len(sizes)], dtype=torch.int64)
                gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(WORLD)]
                dist.all_gather(gathered, steps)
                epochs.append({"keys": keys, "pads": pads, "sizes": sizes, "len": len(loader),
                               "gathered": [int(g.item()) for g in gathered], "partition": loader._partition,
                               "shard_sizes": list(loader.shards.sizes)})
            loader.close()
            resumed = feedfast.DataLoader(SPEC, shards=urls, batch_size=3, shuffle=True, num_workers=1,
                                          last_batch=policy, seed=5, backend="dali")
            resumed.load_state_dict(state)  # type: ignore[arg-type]
            rest = [[k for _, k in resumed.last_origins[: resumed.last_valid]] for _ in resumed]
            resumed.close()
            results[policy] = {"epochs": epochs, "resumed": rest}
    finally:
        dist.destroy_process_group()
    return results


def test_two_ranks_over_http_block_shuffled_see_every_sample_once_with_equal_steps(tmp_path: Path) -> None:
    shards = make_shards(tmp_path / "shards", samples=23, per_shard=5, seed=4)
    for idx in (tmp_path / "shards").glob("*.idx"):
        idx.unlink()  # remote shards come without index files: each rank scans them over http
    everything = Counter(s.key for p in shards for s in scan_tar(p))
    port = free_port()
    with RangeServer(tmp_path / "shards") as srv:  # this process only waits: the server threads have its GIL
        urls = [f"{srv.url}/{Path(p).name}" for p in shards]
        runs = spawn_ranks(_run_rank, WORLD, tmp_path, lambda r: (r, port, urls, str(tmp_path)),
                           timeout_s=JOIN_TIMEOUT_S)
    for policy in POLICIES:
        orders = []
        for e in range(2):
            per_rank = [runs[r][policy]["epochs"][e] for r in range(WORLD)]
            plans = [plan_epoch(per_rank[r]["shard_sizes"], batch_size=3, rank=r, world=WORLD, last_batch=policy,
                                partition="block") for r in range(WORLD)]
            for r, x in enumerate(per_rank):
                assert x["partition"] == "block"
                assert len(x["sizes"]) == x["len"] == plans[r].steps, (policy, e, r)
                assert x["gathered"] == [plans[0].steps] * WORLD, (policy, e, r)  # equal steps on every rank
                assert tuple(x["sizes"]) == plans[r].batch_sizes and len(x["pads"]) == plans[r].padded
            seen = Counter(k for x in per_rank for batch in x["keys"] for k in batch)
            if policy == "drop":
                assert max(seen.values()) == 1 and sum(seen.values()) == 23 - sum(p.dropped for p in plans)
            else:
                assert seen == everything, (policy, e)  # every sample exactly once over both ranks
            orders.append([k for x in per_rank for batch in x["keys"] for k in batch])
        assert orders[0] != orders[1], policy  # each epoch its own order
        for r in range(WORLD):  # resumed after batch 0 of epoch 0: the same remaining batches
            assert runs[r][policy]["resumed"] == runs[r][policy]["epochs"][0]["keys"][1:], (policy, r)
