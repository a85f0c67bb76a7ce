"""Per-rank figures and the straggler, with two real gloo processes on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from feedfast.meter import ManualClock, StallMeter
from feedfast.meter.dist import aggregate, straggler
from tests.helpers import free_port


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        clock = ManualClock()
        meter = StallMeter(samplers=False, device="cpu", clock=clock, batch_size=4)  # default warm-up and minimum
        wait_s = 0.001 if rank == 0 else 0.020  # rank 1 is the slow reader

        def loader() -> Iterator[int]:
            for i in range(50):
                clock.advance(wait_s)
                yield i

        for _batch in meter.wrap(loader()):
            clock.advance(0.010)  # the step
        summary = meter.summary(all_ranks=True)
        gathered = meter.gather()
        table = meter.table(all_ranks=True)
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps({"summary": summary, "gather": gathered, "table": table})
        )
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_name_the_straggler_and_the_top_level_is_the_job(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        summary, gathered = result["summary"], result["gather"]
        assert summary["world_size"] == 2 and gathered["world_size"] == 2
        assert [r["rank"] for r in summary["ranks"]] == [0, 1]
        assert summary["straggler"]["rank"] == 1 and gathered["straggler"]["rank"] == 1
        fast, slow = summary["ranks"]
        assert slow["wait_s"] > fast["wait_s"]
        assert fast["steps"] == slow["steps"] == summary["steps"] == 40  # 50 after the default warm-up of 10
        # the top level is the job: the worst rank's stall (2/3), not this rank's; samples and rates summed
        assert summary["stall_fraction"] == pytest.approx(0.020 / 0.030) == slow["stall_fraction"]
        assert summary["stall_fraction_mean"] == pytest.approx((0.001 / 0.011 + 0.020 / 0.030) / 2)
        assert summary["verdict"] == "highly input-bound" and "worst rank" in summary["aggregate"]
        assert summary["samples"] == 2 * 40 * 4 and summary["samples_per_s"] == pytest.approx(
            fast["samples_per_s"] + slow["samples_per_s"])
        assert gathered["job"]["stall_fraction"] == summary["stall_fraction"]
        # this rank's own figures stay in ranks[rank]
        assert summary["ranks"][rank]["stall_fraction"] == pytest.approx([0.001 / 0.011, 0.020 / 0.030][rank])
        table = result["table"]
        assert "of every 10 GPU-hours at this rate, 6.7 wait on data (66.7% of 2 GPUs" in table
        assert "straggler: rank 1" in table and "mean stall fraction over ranks: 37.9%" in table
        assert "run, 2 ranks" in table and "last 100 steps, this rank" in table


def test_without_a_process_group_the_process_is_rank_zero() -> None:
    meter = StallMeter(samplers=False, device="cpu")
    out = meter.gather()
    assert out["world_size"] == 1 and out["straggler"]["rank"] == 0


def test_straggler_ties_go_to_the_lowest_rank() -> None:
    ranks = [{"rank": 0, "wait_s": 1.0}, {"rank": 1, "wait_s": 2.0}, {"rank": 2, "wait_s": 2.0}]
    assert straggler(ranks)["rank"] == 1


def test_aggregate_takes_the_worst_stall_sums_rates_and_needs_the_fewest_steps() -> None:
    ranks = [
        {"rank": 0, "steps": 40, "samples": 160, "wall_s": 1.0, "wait_s": 0.02, "stall_fraction": 0.02,
         "samples_per_s": 160.0, "wait_p95_ms": 1.0},
        {"rank": 1, "steps": 20, "samples": 80, "wall_s": 1.2, "wait_s": 0.3, "stall_fraction": 0.25,
         "samples_per_s": 66.7, "wait_p95_ms": None},
    ]
    job = aggregate(ranks, min_steps=30)
    assert job["stall_fraction"] == 0.25 and job["wall_s"] == 1.2 and job["wait_s"] == 0.3
    assert job["samples"] == 240 and job["samples_per_s"] == pytest.approx(226.7)
    assert job["wait_p95_ms"] == 1.0  # a missing figure is left out
    assert job["steps"] == 20 and job["verdict"] == "too few steps"  # the rank with the fewest steps decides
    assert aggregate(ranks, min_steps=20)["verdict"] == "highly input-bound"
    assert job["stall_fraction_mean"] == pytest.approx(0.135)
