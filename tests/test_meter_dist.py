"""Per-rank figures and the straggler, with two real gloo processes on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from feedfast.meter import ManualClock, StallMeter
from feedfast.meter.dist import straggler


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        clock = ManualClock()
        meter = StallMeter(samplers=False, device="cpu", clock=clock, batch_size=4)
        wait_s = 0.001 if rank == 0 else 0.020  # rank 1 is the slow reader

        def loader() -> Iterator[int]:
            for i in range(10):
                clock.advance(wait_s)
                yield i

        for _batch in meter.wrap(loader()):
            clock.advance(0.010)  # the step
        summary = meter.summary(all_ranks=True)
        gathered = meter.gather()
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps({"summary": summary, "gather": gathered})
        )
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_name_the_straggler(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        summary, gathered = result["summary"], result["gather"]
        assert summary["world_size"] == 2 and gathered["world_size"] == 2
        assert [r["rank"] for r in summary["ranks"]] == [0, 1]
        assert summary["straggler"]["rank"] == 1 and gathered["straggler"]["rank"] == 1
        assert summary["ranks"][1]["wait_s"] > summary["ranks"][0]["wait_s"]
        assert summary["ranks"][rank]["steps"] == summary["steps"]


def test_without_a_process_group_the_process_is_rank_zero() -> None:
    meter = StallMeter(samplers=False, device="cpu")
    out = meter.gather()
    assert out["world_size"] == 1 and out["straggler"]["rank"] == 0


def test_straggler_ties_go_to_the_lowest_rank() -> None:
    ranks = [{"rank": 0, "wait_s": 1.0}, {"rank": 1, "wait_s": 2.0}, {"rank": 2, "wait_s": 2.0}]
    assert straggler(ranks)["rank"] == 1
