"""StallMeter with real CUDA events and NVML; skipped without CUDA."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from feedfast.meter import StallMeter

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def sleepy(waits_s: list[float], batch: int = 8) -> Iterator[torch.Tensor]:
    for wait in waits_s:
        time.sleep(wait)
        yield torch.zeros(batch, 4)


def gpu_cycles_per_ms() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    end.synchronize()
    return 2_000_000 / float(start.elapsed_time(end))


def test_idle_gpu_idles_for_the_whole_host_wait() -> None:
    meter = StallMeter(samplers=False, warmup=0)
    assert meter.basis == "gpu-events"
    x = torch.randn(512, 512, device="cuda")
    for _batch in meter.wrap(sleepy([0.010] * 20)):
        (x @ x).sum().item()  # synchronizes: the GPU is drained before each wait
        time.sleep(0.010)
    torch.cuda.synchronize()
    s = meter.summary()
    assert s["steps"] == 20 and s["pending_events"] == 0
    assert abs(s["stall_fraction"] - s["host_stall_fraction"]) < 0.02


def test_queued_gpu_work_hides_the_host_wait() -> None:
    cycles = int(20 * gpu_cycles_per_ms())  # 20 ms of GPU work per step
    meter = StallMeter(samplers=False, warmup=1, min_steps=19)
    for _batch in meter.wrap(sleepy([0.005] * 20)):
        torch.cuda._sleep(cycles)
    before = meter.summary()
    torch.cuda.synchronize()
    s = meter.summary()
    assert before["steps"] <= s["steps"] == 19 and s["pending_events"] == 0
    assert s["host_stall_fraction"] > 0.5
    assert s["stall_fraction"] < 0.05 and s["verdict"] == "not input-bound"


def test_nvml_sampler_reads_the_gpu() -> None:
    pytest.importorskip("pynvml")
    cycles = int(5 * gpu_cycles_per_ms())
    with StallMeter(sample_hz=50) as meter:
        for _batch in meter.wrap(sleepy([0.001] * 40)):
            torch.cuda._sleep(cycles)
            torch.cuda.synchronize()
    s = meter.summary()
    assert s["samplers"]["gpu"].startswith("ok"), s["samplers"]
    assert s["gpu_util"] is not None and s["gpu_util_max"] > 0
    assert s["gpu_mem_max_mb"] > 0
