"""The examples run as a user runs them: as scripts, in subprocesses, on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SMALL = ["--batch-size", "8", "--image-size", "64", "--workers", "2"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One FEEDFAST_CACHE for the module, so the demo set is generated once."""
    return tmp_path_factory.mktemp("examples-cache")


def _run(args: list[str], cache: Path, *, timeout: float, cwd: Path = ROOT) -> str:
    """Run ``python args...`` with this checkout's feedfast; return stdout + stderr, failing on rc != 0."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, FEEDFAST_CACHE=str(cache), PYTHONPATH=path, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _losses(out: str) -> list[float]:
    return [float(v) for v in re.findall(r"step \d+/\d+ loss (\S+)", out)]


def test_train_resnet_on_the_demo_set_checkpoints_the_loader_and_resumes(cache: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint.pt"
    out = _run([str(EXAMPLES / "train_resnet.py"), "--steps", "3", *SMALL, "--checkpoint", str(ckpt)], cache,
               timeout=120)
    losses = _losses(out)
    assert len(losses) == 3 and all(0 < v < 20 for v in losses), out
    assert "generating 256 demo JPEGs" in out and "32 batches per epoch" in out
    saved = torch.load(ckpt, map_location="cpu")
    state = json.loads(saved["loader"])  # the loader's state travels as JSON text
    assert saved["epoch"] == 1 and state["version"] == 2 and state["stats"]["batches"] == 3

    out = _run([str(EXAMPLES / "train_resnet.py"), "--steps", "2", *SMALL, "--resume", str(ckpt)], cache,
               timeout=120)
    assert "resumed from" in out and "epoch 1 step 2/2" in out and "generating" not in out


def test_train_resnet_on_given_shards(cache: Path, shards: list[str]) -> None:
    out = _run([str(EXAMPLES / "train_resnet.py"), "--shards", ",".join(shards), "--epochs", "2", "--batch-size",
                "8", "--image-size", "32", "--workers", "2", "--num-classes", "10"], cache, timeout=120)
    assert len(_losses(out)) == 6 and "epoch 1 step 3/3" in out  # 23 samples in batches of 8: 3 steps, twice
    assert "'delivered': 46" in out


@pytest.mark.slow
def test_train_resnet_with_torch_compile(cache: Path) -> None:
    """torch.compile on the CPU: about 100 s cold on this project's 2-core machine, 20 s with a warm cache."""
    out = _run([str(EXAMPLES / "train_resnet.py"), "--steps", "2", *SMALL, "--compile"], cache, timeout=600)
    assert len(_losses(out)) == 2


def test_ddp_on_two_gloo_ranks_gives_equal_batch_counts(cache: Path, shards: list[str]) -> None:
    out = _run(["-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                f"--master_port={free_port()}", str(EXAMPLES / "ddp.py"), "--shards", ",".join(shards),
                "--batch-size", "4", "--image-size", "32", "--workers", "1", "--device", "cpu",
                "--num-classes", "10"], cache, timeout=180)
    per_epoch = dict(re.findall(r"rank (\d)/2: (\d+) batches per epoch", out))
    ran = dict(re.findall(r"rank (\d)/2: epoch 0 ran (\d+) steps", out))
    assert per_epoch == {"0": "3", "1": "3"}, out  # 23 samples: 12 and 11 per rank, 3 batches of <= 4 each
    assert ran == {"0": "3", "1": "3"}, out
    assert "batches per epoch on every rank: [3, 3]" in out


def _ddp_module(monkeypatch: pytest.MonkeyPatch) -> object:
    """examples/ddp.py imported as a module (its sibling import needs examples/ on the path)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("ddp_example", EXAMPLES / "ddp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ddp_with_more_ranks_than_gpus_never_sets_a_device_that_is_not_there(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Two ranks on a one-GPU machine: rank 1 has no cuda:1; ``cuda`` stops saying what to run, ``auto`` uses gloo."""
    ddp: Any = _ddp_module(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    set_to: list[Any] = []
    monkeypatch.setattr(torch.cuda, "set_device", set_to.append)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match="no GPU of its own"):
        ddp.main(["--device", "cuda"])
    assert set_to == []
    with pytest.raises(SystemExit, match=r"rank 1 of 2 on this node has no GPU of its own.*--nproc_per_node=1"):
        ddp.rank_device("cuda", 1, 2)
    assert ddp.rank_device("auto", 1, 2) == torch.device("cpu") == ddp.rank_device("auto", 0, 2)
    assert "every rank runs on the CPU (gloo)" in capsys.readouterr().out
    assert ddp.rank_device("auto", 0, 1) == torch.device("cuda", 0) == ddp.rank_device("cuda", 0, 1)
    assert ddp.rank_device("cpu", 0, 1) == torch.device("cpu")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                    reason="Lightning is a dev dependency: pip install -e '.[dev]' (see the Makefile)")
def test_lightning_example_trains_checkpoints_mid_epoch_and_resumes(cache: Path, shards: list[str],
                                                                     tmp_path: Path) -> None:
    """Two steps with a checkpoint after each, then a resume from the first: it trains the second step again.

    tests/test_lightning.py checks the samples of such a resume, with one process and two.
    """
    common = [str(EXAMPLES / "train_lightning.py"), "--shards", ",".join(shards), "--steps", "2", "--batch-size",
              "4", "--image-size", "32", "--ckpt-dir", str(tmp_path / "ckpts")]
    out = _run([*common, "--save-every", "1"], cache, timeout=180, cwd=tmp_path)
    assert "max_epochs=1` reached" in out, out[-4000:]
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["step=1.ckpt", "step=2.ckpt"]
    saved = torch.load(tmp_path / "ckpts" / "step=1.ckpt", map_location="cpu", weights_only=False)
    (state,) = saved["feedfast_loader_states"]  # one rank's, from the example's LoaderStateHooks
    assert (state["epoch"], state["step"]) == (0, 1)
    out = _run([*common, "--ckpt-path", str(tmp_path / "ckpts" / "step=1.ckpt")], cache, timeout=180, cwd=tmp_path)
    assert "Restored all states" in out and "max_epochs=1` reached" in out, out[-4000:]


def test_measure_any_loader_meters_a_plain_torch_loop(cache: Path, tmp_path: Path) -> None:
    out = _run(["examples/measure_any_loader.py", "--json", str(tmp_path / "meter.json")], cache, timeout=300)
    assert "stall" in out and "samples/s to keep up" in out
    assert (tmp_path / "meter.json").is_file()
