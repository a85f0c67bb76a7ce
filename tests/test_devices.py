"""Where the pipeline runs and where batches go: the one rule, for every combination, and per rank."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

import feedfast
from feedfast._env import rank_cuda_index
from feedfast.errors import UserError
from feedfast.loader.devices import Route, resolve_route
from tests.helpers import SMALL_SPEC, FakeGpu

ROOT = Path(__file__).resolve().parents[1]
CPU, C0, C1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)

# (placement, device) -> (pipeline placement, delivery device, DALI device_id) on a machine with 2 GPUs, current 0
WITH_CUDA = {
    ("auto", None): ("gpu", C0, 0),
    ("auto", "cpu"): ("cpu", CPU, None),
    ("auto", "cuda"): ("gpu", C0, 0),
    ("auto", "cuda:1"): ("gpu", C1, 1),
    ("cpu", None): ("cpu", CPU, None),
    ("cpu", "cpu"): ("cpu", CPU, None),
    ("cpu", "cuda"): ("cpu", C0, None),
    ("cpu", "cuda:1"): ("cpu", C1, None),
    ("gpu", None): ("gpu", C0, 0),
    ("gpu", "cpu"): ("gpu", CPU, 0),
    ("gpu", "cuda"): ("gpu", C0, 0),
    ("gpu", "cuda:1"): ("gpu", C1, 1),
}


@pytest.mark.parametrize(("placement", "device"), sorted(WITH_CUDA, key=str))
def test_every_combination_on_a_cuda_machine(placement: str, device: str | None) -> None:
    got = resolve_route(placement, device, cuda=True, count=2, current=0)
    assert (got.placement, got.device, got.device_id) == WITH_CUDA[(placement, device)]


@pytest.mark.parametrize("placement", ["auto", "cpu", "gpu"])
@pytest.mark.parametrize("device", [None, "cpu", "cuda", "cuda:1"])
def test_every_combination_without_cuda(placement: str, device: str | None) -> None:
    if placement == "gpu" or (device or "").startswith("cuda"):
        with pytest.raises(UserError, match="needs a usable CUDA device"):
            resolve_route(placement, device, cuda=False)
    else:
        assert resolve_route(placement, device, cuda=False) == Route("cpu", CPU, None)


def test_cuda_means_the_rank_gpu_under_torchrun_else_the_current_device() -> None:
    assert rank_cuda_index(local_rank=1, count=2, current=0) == 1
    assert rank_cuda_index(local_rank=None, count=2, current=1) == 1
    assert rank_cuda_index(local_rank=5, count=2, current=0) == 0  # more ranks than GPUs: the current device
    for device in (None, "cuda"):
        got = resolve_route("auto", device, cuda=True, count=2, current=0, local_rank=1)
        assert got == Route("gpu", C1, 1)
    assert resolve_route("cpu", "cuda", cuda=True, count=2, current=0, local_rank=1).device == C1
    assert resolve_route("auto", "cuda:0", cuda=True, count=2, current=0, local_rank=1) == Route("gpu", C0, 0)


@pytest.mark.parametrize("device", ["cuda:2", "tpu", "cuda:x"])
def test_bad_devices_are_named(device: str) -> None:
    with pytest.raises(UserError, match="device"):
        resolve_route("auto", device, cuda=True, count=2, current=0)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int = 1, current: int = 0) -> FakeGpu:
    """Make this process look like a CUDA machine to the loader, with a stand-in device layer."""
    import feedfast.loader.dataloader as dl
    from feedfast import _env

    gpu = FakeGpu()
    _env.cuda_available.cache_clear()
    monkeypatch.setattr(_env, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)

    def layer(self: Any) -> FakeGpu:
        gpu.device = self.device
        return gpu

    monkeypatch.setattr(dl.DataLoader, "_layer", layer)
    return gpu


def test_the_readme_call_on_a_cuda_machine_decodes_on_the_gpu_and_delivers_there(
        monkeypatch: pytest.MonkeyPatch, shards: list[str]) -> None:
    """The shipped spec says ``device: auto``; with no loader arguments both sides must agree on the GPU."""
    _fake_cuda(monkeypatch)
    loader = feedfast.DataLoader(str(ROOT / "pipelines" / "imagenet-train.yaml"), shards=shards, batch_size=4)
    assert loader.plan.placement == "gpu"
    assert any(n.device == "mixed" for n in loader.plan.nodes)  # nvJPEG decode
    assert loader.device == C0 and loader.ring.device == C0 and loader.device_id == 0


def test_asking_for_cpu_tensors_on_a_cuda_machine_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch,
                                                                  shards: list[str]) -> None:
    _fake_cuda(monkeypatch)
    loader = feedfast.DataLoader(str(ROOT / "pipelines" / "imagenet-train.yaml"), shards=shards, batch_size=4,
                                 device="cpu")
    assert loader.plan.placement == "cpu" and loader.device == CPU and loader.device_id is None
    with pytest.warns(UserWarning, match="copied back to host memory"):
        forced = feedfast.DataLoader(SMALL_SPEC, shards=shards, device="cpu", placement="gpu")
    assert forced.plan.placement == "gpu" and forced.device == CPU and forced.device_id == 0


def test_cpu_machine_defaults_stay_on_the_cpu(shards: list[str]) -> None:
    loader = feedfast.DataLoader(SMALL_SPEC, shards=shards)
    assert loader.plan.placement == "cpu" and loader.device == CPU and loader.device_id is None
    with pytest.raises(UserError, match="needs a usable CUDA device"):
        feedfast.DataLoader(SMALL_SPEC, shards=shards, device="cuda")


def _rank_devices(rank: int, out: str) -> None:
    """One rank under a torchrun-like environment on a stand-in 2-GPU machine; what it resolved, as JSON."""
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    try:
        import feedfast.loader.dataloader as dl
        from feedfast import _env

        gpu = FakeGpu()
        _env.cuda_available.cache_clear()
        _env.cuda_available = lambda: True  # type: ignore[assignment]
        torch.cuda.device_count = lambda: 2  # type: ignore[assignment]
        torch.cuda.current_device = lambda: 0  # type: ignore[assignment]  # the user never called set_device

        def layer(self: Any) -> FakeGpu:
            gpu.device = self.device
            return gpu

        dl.DataLoader._layer = layer  # type: ignore[method-assign]
        shards = json.loads(Path(out).with_suffix(".in").read_text())
        result = {}
        for device in (None, "cuda"):
            loader = feedfast.DataLoader(SMALL_SPEC, shards=shards, placement="gpu", device=device)
            result[str(device)] = [loader.rank, str(loader.device), loader.device_id, str(loader.ring.device),
                                   str(gpu.device)]
        Path(out).write_text(json.dumps(result))
    except BaseException:  # noqa: BLE001 - reported to the parent through the file
        Path(out).write_text(json.dumps({"error": traceback.format_exc()}))


def test_two_ranks_use_their_own_gpu(tmp_path: Path, shards: list[str]) -> None:
    ctx = mp.get_context("spawn")
    procs, outs = [], []
    for rank in range(2):
        out = tmp_path / f"rank{rank}.json"
        out.with_suffix(".in").write_text(json.dumps(shards))
        outs.append(out)
        procs.append(ctx.Process(target=_rank_devices, args=(rank, str(out))))
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for rank, out in enumerate(outs):
        result = json.loads(out.read_text())
        assert "error" not in result, result.get("error")
        want = [rank, f"cuda:{rank}", rank, f"cuda:{rank}", f"cuda:{rank}"]
        assert result == {"None": want, "cuda": want}
