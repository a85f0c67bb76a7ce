"""The GPU path's defects of issue 23, each checked on the CPU with the stand-in device layer.

Each test failed on the code before its fix: placement with an op forced onto the GPU (1),
the producer thread's current device (2), NVML's GPU under ``CUDA_VISIBLE_DEVICES`` (3), the
meter's events' device (4), threads per rank (5), the next epoch's build after the batch
that triggered it (6), DALI checkpoints only when a state needs one (7), the pixel
comparison's reference backend (8).
"""

from __future__ import annotations

import copy
import sys
import threading
import types
from typing import Any

import pytest
import torch

import feedfast
from feedfast.errors import UserError
from feedfast.loader.devices import Route
from tests.helpers import FakeGpu


def fake_cuda(monkeypatch: pytest.MonkeyPatch, *, count: int = 2, current: int = 0) -> FakeGpu:
    """This process as a machine with ``count`` CUDA devices, and the loader's device layer a stand-in."""
    import feedfast.loader.dataloader as dl
    from feedfast import _env

    gpu = FakeGpu()
    _env.cuda_available.cache_clear()
    monkeypatch.setattr(_env, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    def layer(self: Any) -> FakeGpu:
        gpu.device = self.device
        return gpu

    monkeypatch.setattr(dl.DataLoader, "_layer", layer)
    return gpu


def gpu_flip_spec(small_spec: dict) -> dict:
    """The small spec with its flip forced onto the GPU (``device: gpu``)."""
    spec = copy.deepcopy(small_spec)
    spec["pipeline"]["image"][2] = {"flip": {"horizontal": 0.5, "device": "gpu"}}
    return spec


# ---------------------------------------------------------------------------- 1: an op forced onto the GPU
@pytest.mark.parametrize("device", [None, "cuda", "cuda:1"])
def test_an_op_forced_onto_the_gpu_under_cpu_placement_gets_a_gpu_device_id(
        monkeypatch: pytest.MonkeyPatch, small_spec: dict, shards: list[str], device: str | None) -> None:
    fake_cuda(monkeypatch)
    loader = feedfast.DataLoader(gpu_flip_spec(small_spec), shards=shards, placement="cpu", device=device)
    want = 1 if device == "cuda:1" else 0
    assert loader.plan.placement == "gpu"
    assert loader.device_id == want and loader.device == torch.device("cuda", want)


def test_an_op_forced_onto_the_gpu_without_cuda_is_refused_naming_it(small_spec: dict, shards: list[str]) -> None:
    with pytest.raises(UserError, match=r"pipeline\.image\[2\] has device: gpu, which needs a usable CUDA device"):
        feedfast.DataLoader(gpu_flip_spec(small_spec), shards=shards, placement="cpu")


def test_a_gpu_plan_is_never_built_without_a_device_id(small_spec: dict, shards: list[str]) -> None:
    from feedfast.compile.build import build_plan
    from feedfast.errors import BackendError
    from feedfast.loader.backends.dali.life import StepQueue
    from feedfast.loader.backends.dali.pipe import make_life

    loader = feedfast.DataLoader(small_spec, shards=shards, backend="dali")
    plan = build_plan(loader.spec, device="gpu")
    with pytest.raises(BackendError, match="needs DALI's device_id"):
        make_life(plan, StepQueue(None, holds=2), batch_size=4, threads=1, device_id=None, seed=3, depth=2,
                  checkpoint=None)
    loader.close()


# ---------------------------------------------------------------------------- 2: the producer thread's device
@pytest.mark.parametrize("backend", ["threads", "dali"])
def test_the_producer_thread_sets_the_delivery_device_before_any_cuda_call(
        monkeypatch: pytest.MonkeyPatch, small_spec: dict, shards: list[str], backend: str) -> None:
    """Rank 1 of a 2-GPU node delivers to cuda:1: every copy and event of its producer thread is on device 1.

    A thread that never calls set_device works on device 0 (``torch.cuda.stream`` then saves and
    restores device 0's stream and opens a context there); the stand-in layer records each
    thread's current device at every copy and event record.
    """
    import feedfast.loader.dataloader as dl

    gpu = fake_cuda(monkeypatch)
    monkeypatch.setattr(dl, "route_here", lambda placement, device: Route("cpu", torch.device("cuda", 1), None))
    loader = feedfast.DataLoader(small_spec, shards=shards, num_workers=1, backend=backend)
    assert loader.ring.device == torch.device("cuda", 1)
    assert sum(1 for _ in loader) == 6
    on_producer = [(name, index) for name, index in gpu.used_devices if name.startswith("feedfast-rank")]
    assert len(on_producer) >= 12  # a copy and an event per batch
    assert {index for _, index in on_producer} == {1}, on_producer[:4]
    assert gpu.current_device() == 0  # the training thread's own device is left alone
    loader.close()


def test_ahead_runs_its_setup_on_its_thread_before_producing() -> None:
    from feedfast.loader.producer import Ahead

    seen: list[str] = []

    def produce() -> Any:
        seen.append(f"produce:{threading.current_thread().name}")
        yield 1

    items = list(Ahead(produce, depth=1, name="t-setup",
                       setup=lambda: seen.append(f"setup:{threading.current_thread().name}")))
    assert items == [1] and seen == ["setup:t-setup", "produce:t-setup"]


# ---------------------------------------------------------------------------- 3 and 4: the meter's device
def fake_nvml(opened: list[tuple[str, Any]]) -> Any:
    """A pynvml stand-in recording which GPU handle was asked for."""
    nvml: Any = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def by_index(index: int) -> str:
        opened.append(("index", index))
        return f"gpu{index}"

    def by_uuid(uuid: str) -> str:
        opened.append(("uuid", uuid))
        return uuid

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = by_index
    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=50, memory=1)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=1 << 20)
    nvml.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=0)
    return nvml


def _meter_gpu(monkeypatch: pytest.MonkeyPatch, visible: str | None, local_rank: str | None, **meter: Any) -> Any:
    """(the NVML handles a started-and-stopped StallMeter asked for, the meter) on a stand-in 2-GPU rank."""
    from feedfast.meter import StallMeter

    fake_cuda(monkeypatch)
    opened: list[tuple[str, Any]] = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(opened))
    for name, value in (("CUDA_VISIBLE_DEVICES", visible), ("LOCAL_RANK", local_rank)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    m = StallMeter(sample_hz=200, **meter)
    m.start()
    m.stop()
    return opened, m


@pytest.mark.parametrize(("visible", "local_rank", "want"), [
    (None, "1", ("index", 1)),
    ("2,3", "1", ("index", 3)),
    ("3,2", None, ("index", 3)),
    ("GPU-aaaa,GPU-bbbb", "1", ("uuid", "GPU-bbbb")),
])
def test_nvml_samples_the_meters_gpu_through_cuda_visible_devices(
        monkeypatch: pytest.MonkeyPatch, visible: str | None, local_rank: str | None, want: tuple[str, Any]) -> None:
    opened, meter = _meter_gpu(monkeypatch, visible, local_rank)
    assert opened == [want]
    assert meter.summary()["samplers"]["gpu"].startswith("ok")


def test_nvml_of_a_device_outside_cuda_visible_devices_is_unavailable_not_gpu_0(
        monkeypatch: pytest.MonkeyPatch) -> None:
    opened, meter = _meter_gpu(monkeypatch, "2", None, device="cuda:1")
    assert opened == [] and "not among CUDA_VISIBLE_DEVICES='2'" in meter.summary()["samplers"]["gpu"]


def test_nvml_target_reads_cuda_visible_devices_as_cuda_does() -> None:
    from feedfast.meter.nvml import nvml_target

    assert nvml_target(1, None) == (1, None)
    assert nvml_target(0, "1, 0") == (1, None)
    assert nvml_target(1, "0,x,2") == (None, None)  # CUDA stops at the first entry it cannot read
    assert nvml_target(0, "MIG-abc") == (None, "MIG-abc")
    assert nvml_target(0, "") == (None, None) and nvml_target(0, "-1") == (None, None)


@pytest.mark.parametrize(("device", "local_rank", "want"), [("auto", "1", 1), ("cuda", "1", 1), ("auto", None, 0),
                                                           ("cuda:0", "1", 0), ("auto", "5", 0)])
def test_the_meters_events_are_on_the_loaders_device(monkeypatch: pytest.MonkeyPatch, shards: list[str],
                                                     small_spec: dict, device: str, local_rank: str | None,
                                                     want: int) -> None:
    """The user never called set_device: the loader delivers to cuda:{LOCAL_RANK}, and the meter's events follow."""
    from feedfast.meter.events import CudaEvents

    _, meter = _meter_gpu(monkeypatch, None, local_rank, device=device, samplers=False)
    events = meter._events
    assert isinstance(events, CudaEvents) and events.describe().startswith(f"cuda:{want} ")
    assert events.device == torch.device("cuda", want)
    if device == "auto":
        loader = feedfast.DataLoader(small_spec, shards=shards, placement="cpu", device="cuda")
        assert loader.device == events.device  # one rule for both


# ---------------------------------------------------------------------------- 5: threads per rank
def test_default_threads_are_this_ranks_share_of_the_cores(monkeypatch: pytest.MonkeyPatch, small_spec: dict,
                                                            shards: list[str]) -> None:
    from feedfast import _env

    monkeypatch.setattr(_env, "usable_cores", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert feedfast.DataLoader(small_spec, shards=shards, backend="dali").threads == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")  # more ranks than cores: one each
    assert feedfast.DataLoader(small_spec, shards=shards).threads == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert feedfast.DataLoader(small_spec, shards=shards).threads == 16
    assert feedfast.DataLoader(small_spec, shards=shards, num_workers=3).threads == 3  # an explicit count wins
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(UserError, match="LOCAL_WORLD_SIZE"):
        feedfast.DataLoader(small_spec, shards=shards)


# ---------------------------------------------------------------------------- 6: the next epoch's build
def test_the_batch_that_triggers_the_next_epochs_build_is_handed_over_before_the_build(
        monkeypatch: pytest.MonkeyPatch, small_spec: dict, shards: list[str]) -> None:
    from feedfast.loader.backends.dali import backend as backends
    made: list[int] = []
    handed: list[int] = []
    at_build: list[tuple[int, int]] = []
    run_epoch, prepare = backends.run_life_epoch, backends.DaliBackend.prepare

    def counting_run_epoch(*args: Any, **kwargs: Any) -> Any:
        for batch in run_epoch(*args, **kwargs):
            made.append(1)
            yield batch

    def spying_prepare(self: Any, epoch: int) -> None:
        at_build.append((len(made), len(handed)))
        prepare(self, epoch)

    monkeypatch.setattr(backends, "run_life_epoch", counting_run_epoch)
    monkeypatch.setattr(backends.DaliBackend, "prepare", spying_prepare)
    loader = feedfast.DataLoader(small_spec, shards=shards, backend="dali", num_workers=1, prefetch_factor=2)
    batches = loader._backend.batches

    def counting_batches(*args: Any, **kwargs: Any) -> Any:
        for batch in batches(*args, **kwargs):
            handed.append(1)
            yield batch

    monkeypatch.setattr(loader._backend, "batches", counting_batches)
    assert sum(1 for _ in loader) == 6
    (built,) = at_build
    assert built[0] == built[1] > 0, f"{built[0]} batches made, {built[1]} handed over when the build started"
    loader.close()


# ---------------------------------------------------------------------------- 7: DALI checkpoints
def _checkpoints(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from feedfast.loader.backends.dali.life import LifePipe

    taken: list[int] = []
    original = LifePipe.checkpoint

    def counted(self: Any) -> str:
        taken.append(1)
        return original(self)

    monkeypatch.setattr(LifePipe, "checkpoint", counted)
    return taken


def test_dali_checkpoints_only_when_a_state_needs_one(monkeypatch: pytest.MonkeyPatch, small_spec: dict,
                                                      shards: list[str]) -> None:
    taken = _checkpoints(monkeypatch)
    spec = copy.deepcopy(small_spec)
    spec["batch"] = {"size": 1}  # 23 steps
    plain = feedfast.DataLoader(spec, shards=shards, backend="dali", num_workers=1)
    assert sum(1 for _ in plain) == 23 and len(taken) < 23, f"{len(taken)} checkpoints in 23 batches"
    from feedfast.loader.backends.dali.pipe import CHECKPOINT_EVERY

    assert len(taken) == 23 // CHECKPOINT_EVERY + 1  # and after the epoch's last batch: the pipeline runs on
    taken.clear()
    with_info = feedfast.DataLoader(spec, shards=shards, backend="dali", num_workers=1, sample_info=True)
    assert sum(1 for _ in with_info) == 23 and len(taken) == 23  # every batch carries its state
    plain.close()
    with_info.close()


@pytest.mark.parametrize("stop", [3, 17, 20])
def test_a_dali_state_between_checkpoints_resumes_exactly(small_spec: dict, shards: list[str], stop: int) -> None:
    """The state after ``stop`` batches, with DALI's last checkpoint before it: the rest of the epoch, pixels too."""
    spec = copy.deepcopy(small_spec)
    spec["batch"] = {"size": 1}
    whole = [(x.clone(), list(loader_keys)) for x, loader_keys in _epoch(spec, shards)]
    loader = feedfast.DataLoader(spec, shards=shards, backend="dali", num_workers=1, shuffle=False)
    it = iter(loader)
    for _ in range(stop):
        next(it)
    state = loader.state_dict()
    from feedfast.loader.backends.dali.pipe import CHECKPOINT_EVERY

    anchor = stop // CHECKPOINT_EVERY * CHECKPOINT_EVERY  # DALI's last checkpoint, or the epoch's start (null)
    assert state["step"] == stop and (state["dali"] or {"step": 0})["step"] == anchor
    loader.close()
    resumed = feedfast.DataLoader(spec, shards=shards, backend="dali", num_workers=1, shuffle=False)
    resumed.load_state_dict(state)
    rest = []
    for x, _ in resumed:
        rest.append((x.clone(), list(resumed.last_origins)))
    assert [k for _, k in rest] == [k for _, k in whole[stop:]]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(rest, whole[stop:]))
    assert resumed.stats()["batches"] == 23
    resumed.close()


def _epoch(spec: dict, shards: list[str]) -> list[tuple[torch.Tensor, Any]]:
    loader = feedfast.DataLoader(spec, shards=shards, backend="dali", num_workers=1, shuffle=False)
    out = [(x, loader.last_origins) for x, _ in loader]
    loader.close()
    return out


# ---------------------------------------------------------------------------- 8: the pixel comparison's reference
def test_gpu_pixels_are_compared_with_dalis_cpu_decode(small_spec: dict, shards: list[str]) -> None:
    from tests.test_loader_gpu import dali_cpu_reference

    loader = dali_cpu_reference(small_spec, shards)
    assert loader.backend == "dali" and loader.plan.placement == "cpu" and loader.device.type == "cpu"
    loader.close()
