"""Lightning over feedfast: a checkpoint taken mid-epoch resumes, in a new process, on exactly the remaining samples.

Each test runs ``tests/lightning_job.py`` twice: an uninterrupted two-epoch run that saves a
checkpoint after step K and trains on, then ``Trainer.fit(..., ckpt_path=...)`` from that
checkpoint in a new process. The resumed run's training steps (sample keys, labels and a
digest of the pixels, so the augmentations too) must equal the uninterrupted run's steps
after K, rank by rank. LitData's users report that Lightning does not restore that loader's
state (Lightning-AI/litdata #775); this keeps showing that feedfast's is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import SMALL_SPEC, free_port, make_shards

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "lightning_job.py"

# not imported here: Lightning takes seconds to import, and the jobs run in their own processes
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                reason="Lightning is a dev dependency: pip install -e '.[dev]' (see the Makefile)")


def lightning_env(cache: Path) -> dict[str, str]:
    """The environment of a Lightning subprocess: this checkout's feedfast, one cache."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, FEEDFAST_CACHE=str(cache), PYTHONPATH=path, PYTHONUNBUFFERED="1",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def _run(args: list[str], env: dict[str, str], *, timeout: float = 150) -> None:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"


def _steps(record: Path) -> dict[int, list[dict[str, Any]]]:
    """The record's training steps by rank, in order."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for line in record.read_text().splitlines():
        step = json.loads(line)
        by_rank.setdefault(step.pop("rank"), []).append(step)
    return by_rank


@pytest.fixture(scope="module")
def job_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Spec and shards: 40 samples in 4 shards, batches of 4 (10 steps per epoch on one rank, 5 on two)."""
    data = tmp_path_factory.mktemp("lightning-data")
    spec = data / "spec.yaml"
    spec.write_text(yaml.safe_dump(SMALL_SPEC))
    shards = make_shards(data / "shards", samples=40, per_shard=10)
    return [str(JOB), "--spec", str(spec), "--shards", ",".join(shards)]


def _check_resume(job_args: list[str], tmp_path: Path, *, save_at: int, steps_per_epoch: int, ranks: int,
                  first: list[str], then: list[str]) -> None:
    env = lightning_env(tmp_path / "cache")
    whole, resumed, ckpt = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl", tmp_path / "mid.ckpt"
    _run([*first, *job_args, "--record", str(whole), "--save-at", str(save_at), "--ckpt", str(ckpt)], env)
    assert ckpt.is_file()
    _run([*then, *job_args, "--record", str(resumed), "--ckpt-path", str(ckpt)], env)
    whole_steps, resumed_steps = _steps(whole), _steps(resumed)
    assert sorted(whole_steps) == sorted(resumed_steps) == list(range(ranks))
    for rank in range(ranks):
        steps = whole_steps[rank]
        assert len(steps) == 2 * steps_per_epoch  # two epochs
        assert [(s["epoch"], s["step"]) for s in steps[save_at:save_at + 1]] == [(0, save_at)]  # mid-epoch 0
        assert resumed_steps[rank] == steps[save_at:], f"rank {rank}: the resumed run trained on other samples"
    for epoch in (0, 1):  # over all ranks, each epoch is every sample once
        keys = [k for steps in whole_steps.values() for s in steps if s["epoch"] == epoch for k in s["keys"]]
        assert len(keys) == len(set(keys)) == 40


@pytest.mark.slow
def test_mid_epoch_checkpoint_resumes_on_the_remaining_samples(job_args: list[str], tmp_path: Path) -> None:
    """One process: checkpoint after step 3 of 10 in epoch 0, resume, train steps 3..9 and epoch 1 as before."""
    _check_resume(job_args, tmp_path, save_at=3, steps_per_epoch=10, ranks=1, first=[], then=[])


@pytest.mark.slow
def test_mid_epoch_checkpoint_resumes_under_two_ddp_processes(job_args: list[str], tmp_path: Path) -> None:
    """DDP on gloo, two CPU processes: each rank resumes on its own remaining samples.

    Both runs start their two ranks with torchrun (both import Lightning at once: Lightning's own
    launcher, which ``python train.py`` with ``devices=2`` uses, starts the second only after the
    first has imported everything, which costs this 2-core machine another 10 s a run).
    """
    def torchrun() -> list[str]:
        return ["-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                f"--master_port={free_port()}"]

    ddp = [*job_args, "--devices", "2"]
    _check_resume(ddp, tmp_path, save_at=2, steps_per_epoch=5, ranks=2, first=torchrun(), then=torchrun())


def test_batches_with_sample_info_pass_through_lightnings_batch_transfer() -> None:
    pytest.importorskip("lightning_fabric")  # the part of Lightning that moves batches, without torchmetrics
    import torch
    from lightning_fabric.utilities.apply_func import move_data_to_device

    from feedfast.loader.batch import BatchInfo

    info = BatchInfo(origins=(("a.tar", "k0"),), valid=torch.ones(1, dtype=torch.bool), epoch=0, step=0, state={})
    images, moved = move_data_to_device((torch.zeros(1, 3), info), torch.device("cpu"))
    assert moved.keys == ["k0"] and bool(moved.valid[0])
