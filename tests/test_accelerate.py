"""Hugging Face Accelerate over a feedfast loader behaves as over a prepared torch DataLoader.

Gradient accumulation syncs on the epoch's last batch, ``skip_first_batches`` yields the
epoch's remaining batches, and two processes (spawned with the launcher's variables, and
``accelerate launch`` running ``examples/accelerate_train.py``) split each epoch as torchrun does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

import feedfast
from tests.helpers import ROOT, SMALL_SPEC, free_port, rank_report, spawn_ranks

accelerate = pytest.importorskip("accelerate", reason="the `test` extra installs Accelerate")


@pytest.fixture()
def accelerator() -> Iterator[Any]:
    """A CPU Accelerator in this process, its shared states cleared afterwards (they are process-wide)."""
    from accelerate.state import AcceleratorState, GradientState

    made: list[Any] = []

    def make(**kw: Any) -> Any:
        acc = accelerate.Accelerator(cpu=True, **kw)
        made.append(acc)
        return acc

    yield make
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _syncs(acc: Any, batches: Any) -> list[int]:
    """The steps (1-based) at which ``accelerator.accumulate`` synced gradients over ``batches``."""
    model = torch.nn.Linear(1, 1)
    model = acc.prepare(model)
    synced = []
    for step, _ in enumerate(batches, 1):
        with acc.accumulate(model):
            if acc.sync_gradients:
                synced.append(step)
    return synced


def test_accumulation_syncs_on_the_epochs_last_batch_as_over_a_torch_dataloader(accelerator: Any,
                                                                                shards: list[str]) -> None:
    acc = accelerator(gradient_accumulation_steps=4)
    loader = feedfast.DataLoader(SMALL_SPEC, shards=shards, batch_size=1, num_workers=2)  # 23 batches
    torch_loader = acc.prepare(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(23)), batch_size=1))
    assert acc.prepare(loader) is loader  # Accelerate hands non-torch loaders back unchanged
    expected = _syncs(acc, torch_loader)
    assert expected == [4, 8, 12, 16, 20, 23]
    assert _syncs(acc, loader) == expected
    assert _syncs(acc, loader) == expected  # the next epoch too
    assert not acc.gradient_state.in_dataloader  # the loader unregistered at the end of each epoch


def test_a_stopped_epoch_unregisters_from_accelerate(accelerator: Any, shards: list[str]) -> None:
    acc = accelerator(gradient_accumulation_steps=2)
    loader = feedfast.DataLoader(SMALL_SPEC, shards=shards, num_workers=2)
    it = iter(loader)
    next(it)
    assert acc.gradient_state.in_dataloader and not acc.gradient_state.end_of_dataloader
    it.close()  # type: ignore[attr-defined]  # a break out of the loop (the loop closes its iterator)
    assert not acc.gradient_state.in_dataloader


def test_without_an_accelerator_nothing_registers(shards: list[str]) -> None:
    from accelerate.state import GradientState

    GradientState._reset_state()
    loader = feedfast.DataLoader(SMALL_SPEC, shards=shards, num_workers=2)
    assert sum(1 for _ in loader) == 6 and not GradientState._shared_state


def test_skip_first_batches_yields_the_epochs_remaining_batches(accelerator: Any, shards: list[str]) -> None:
    acc = accelerator()
    expected = [(x.clone(), y.clone()) for x, y in feedfast.DataLoader(SMALL_SPEC, shards=shards, shuffle=True,
                                                                        num_workers=2)]
    loader = feedfast.DataLoader(SMALL_SPEC, shards=shards, shuffle=True, num_workers=2)
    for skipper in (accelerate.skip_first_batches, acc.skip_first_batches):
        loader.set_epoch(0)
        rest = skipper(loader, 2)
        assert len(rest) == 4
        got = list(rest)
        assert len(got) == 4
        for (x, y), (ex, ey) in zip(got, expected[2:]):
            assert torch.equal(x, ex) and torch.equal(y, ey)


@pytest.mark.parametrize("form", ["tuple", "dict"])
def test_skip_first_batches_keeps_sample_info(accelerator: Any, shards: list[str], form: str) -> None:
    """Over a loader with sample_info=True the rest of the epoch comes in the loader's structure: (images, labels,
    info) or a dict with "sample_info", each batch's info its own (keys, valid rows, step, the state after it)."""
    acc = accelerator()
    spec = {**SMALL_SPEC, "outputs": {"image": "image", "label": "label"}} if form == "dict" \
        else SMALL_SPEC
    expected = list(feedfast.DataLoader(spec, shards=shards, shuffle=True, num_workers=2, sample_info=True))
    loader = feedfast.DataLoader(spec, shards=shards, shuffle=True, num_workers=2, sample_info=True)
    loader = acc.prepare(loader)
    for skipper in (accelerate.skip_first_batches, acc.skip_first_batches):
        loader.set_epoch(0)
        got = list(skipper(loader, 3))
        assert len(got) == len(expected) - 3 == 3
        for batch, want in zip(got, expected[3:]):
            if form == "dict":
                assert set(batch) == set(want) and "sample_info" in batch
                x, y, info, ex, ey, einfo = (batch["image"], batch["label"], batch["sample_info"], want["image"],
                                             want["label"], want["sample_info"])
            else:
                assert len(batch) == len(want) == 3
                (x, y, info), (ex, ey, einfo) = batch, want
            assert isinstance(info, feedfast.BatchInfo) and torch.equal(x, ex) and torch.equal(y, ey)
            assert info.keys == einfo.keys and torch.equal(info.valid, einfo.valid)
            assert (info.epoch, info.step) == (einfo.epoch, einfo.step) == (0, einfo.step)
            assert {**info.state, "stats": None} == {**einfo.state, "stats": None}  # stats count the loader's life


def _accelerate_rank(out: str, rank: int, world: int, port: int, shards: list[str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

    def body() -> dict[str, Any]:
        acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
        loader = feedfast.DataLoader(SMALL_SPEC, shards=shards, shuffle=True, num_workers=1)
        keys: list[str] = []

        def epoch() -> Iterator[Any]:
            for batch in loader:
                keys.extend(k for _, k in loader.last_origins[: loader.last_valid])
                yield batch

        torch_loader = acc.prepare(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(23)), batch_size=4))
        return {"process": [acc.process_index, acc.num_processes], "loader": [loader.rank, loader.world],
                "syncs": _syncs(acc, epoch()), "torch_syncs": _syncs(acc, torch_loader), "keys": keys,
                "backend": torch.distributed.get_backend()}

    rank_report(out, rank, body)


@pytest.mark.slow
def test_two_accelerate_processes_split_the_epoch_as_torchrun(tmp_path: Path, shards: list[str]) -> None:
    port = free_port()
    reports = spawn_ranks(_accelerate_rank, 2, tmp_path, lambda r: (str(tmp_path), r, 2, port, shards),
                          timeout_s=240)
    assert [r["process"] for r in reports] == [r["loader"] for r in reports] == [[0, 2], [1, 2]]
    assert {r["backend"] for r in reports} == {"gloo"}
    keys = [k for r in reports for k in r["keys"]]
    assert len(keys) == len(set(keys)) == 23  # every sample once, on one rank
    assert [r["syncs"] for r in reports] == [r["torch_syncs"] for r in reports] == [[2, 3], [2, 3]]


@pytest.mark.slow
def test_accelerate_launch_runs_the_example_on_two_processes(tmp_path: Path, shards: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               PYTHONUNBUFFERED="1", ACCELERATE_CONFIG_FILE=str(tmp_path / "none.yaml"))
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port())]
    script = [str(ROOT / "examples" / "accelerate_train.py"), "--cpu", "--shards", ",".join(shards),
              "--batch-size", "4", "--image-size", "32", "--workers", "1", "--num-classes", "10",
              "--accumulate", "2", "--epochs", "2", "--skip", "1", "--state-dir", str(tmp_path / "state")]
    proc = subprocess.run([*launch, *script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert sorted(re.findall(r"process (\d)/2: loader rank (\d)/2, 3 batches per epoch", out)) == [("0", "0"),
                                                                                                   ("1", "1")]
    # epoch 0 skips its first batch (2 batches, the last one synced), epoch 1 runs whole (syncs at 2 and 3)
    epochs = sorted(re.findall(r"process (\d)/2: epoch (\d): (\d) batches, (\d) gradient syncs, (\d+) samples", out))
    assert epochs == [("0", "0", "2", "1", "8"), ("0", "1", "3", "2", "12"),
                      ("1", "0", "2", "1", "8"), ("1", "1", "3", "2", "12")], out[-3000:]
    losses = [float(v) for v in re.findall(r"loss (\S+) synced", out)]
    assert losses and all(0 < v < 20 for v in losses)
    assert (tmp_path / "state").is_dir()
