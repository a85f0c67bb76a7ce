"""Background samplers: CPU through psutil, GPU through NVML (a fake NVML here)."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from feedfast.meter import CpuSampler, NvmlSampler, StallMeter
from feedfast.meter.samplers import ThreadSampler


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_sampler_sees_this_process_working() -> None:
    sampler = CpuSampler(hz=20)
    with StallMeter(samplers=[sampler], device="cpu", batch_size=1) as meter:
        for _batch in meter.wrap(range(3)):
            burn(0.15)
    s = meter.summary()
    assert s["samplers"] == {"cpu": "ok"}
    assert s["cpu_util"] is not None and s["cpu_util_max"] > 0.0
    assert len(s["cpu_per_core"]) >= 1


def test_default_samplers_start_and_stop_with_the_meter() -> None:
    meter = StallMeter(device="cpu", sample_hz=50)
    with meter:
        time.sleep(0.1)
    s = meter.summary()
    assert s["samplers"]["cpu"] == "ok"
    assert s["samplers"]["gpu"].startswith(("ok", "unavailable"))
    if s["samplers"]["gpu"].startswith("unavailable"):
        assert s["gpu_util"] is None and s["gpu_mem_mb"] is None


def test_nvml_without_the_module_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    sampler = NvmlSampler(hz=50)
    sampler.start()
    sampler.stop()
    assert "nvidia-ml-py is not installed" in sampler.status()
    assert sampler.figures()["gpu_util"] is None


@pytest.mark.parametrize(("gpu_files", "want"), [
    ([], "no GPU (no NVIDIA device or driver on this machine)"),
    (["dev/nvidia0"], "unavailable (NVML did not start: NVML Shared Library Not Found)"),
])
def test_nvml_that_cannot_start_says_no_gpu_where_there_is_none(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gpu_files: list[str], want: str) -> None:
    """bench's cell: "no GPU" on a machine without one; NVML's reason on a machine with a GPU and no NVML."""
    from feedfast.cli.common import gpu_cell
    from feedfast.cli.sysprobe import _nvml
    from feedfast.meter import nvml as nvml_module

    for name in gpu_files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    monkeypatch.setattr(nvml_module, "_GPU_MARKERS", (str(tmp_path / "dev/nvidia[0-9]*"),
                                                      str(tmp_path / "proc/driver/nvidia/gpus/*")))
    nvml = fake_nvml(gpm=False)

    def no_library() -> None:
        raise nvml.NVMLError("NVML Shared Library Not Found")

    nvml.nvmlInit = no_library
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = NvmlSampler(hz=50)
    sampler.start()
    sampler.stop()
    assert gpu_cell(None, sampler.status()) == want
    assert _nvml()["status"] == (want[len("unavailable ("):-1] if want.startswith("unavailable (") else want)


def fake_nvml(gpm: bool) -> Any:
    nvml: Any = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class MetricsGet:
        def __init__(self) -> None:
            self.metrics = [types.SimpleNamespace(metricId=0, value=0.0)]

    def metrics_get(request: MetricsGet) -> MetricsGet:
        request.metrics[0].value = 42.0
        return request

    def gpm_support(handle: Any) -> Any:
        return types.SimpleNamespace(isSupportedDevice=int(gpm))

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: f"gpu{index}"
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: f"gpu-{uuid}"
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=80, memory=10)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2 * 1024 * 1024 * 1024)
    nvml.nvmlGpmQueryDeviceSupport = gpm_support
    nvml.nvmlGpmSampleAlloc = object
    nvml.nvmlGpmSampleGet = lambda handle, sample: sample
    nvml.nvmlGpmSampleFree = lambda sample: None
    nvml.c_nvmlGpmMetricsGet_t = MetricsGet
    nvml.nvmlGpmMetricsGet = metrics_get
    nvml.NVML_GPM_METRICS_GET_VERSION = 1
    nvml.NVML_GPM_METRIC_SM_UTIL = 2
    return nvml


@pytest.mark.parametrize("gpm", [True, False])
def test_nvml_sampler_reads_utilization_memory_and_sm(
    monkeypatch: pytest.MonkeyPatch, gpm: bool
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpm))
    sampler = NvmlSampler(hz=100)
    sampler.start()
    time.sleep(0.1)
    sampler.stop()
    figures = sampler.figures()
    assert figures["gpu_util"] == pytest.approx(80.0) and figures[
        "gpu_mem_max_mb"
    ] == pytest.approx(2048.0)
    if gpm:
        assert sampler.status() == "ok; sm: ok" and figures["gpu_sm_active"] == pytest.approx(42.0)
    else:
        assert "no GPM" in sampler.status() and figures["gpu_sm_active"] is None


def test_a_failing_sampler_warns_and_keeps_the_reason() -> None:
    class Broken(ThreadSampler):
        name = "broken"

        def _sample(self) -> None:
            raise OSError("sensor gone")

        def figures(self) -> dict[str, Any]:
            return {}

    sampler = Broken(hz=100)
    with pytest.warns(RuntimeWarning, match="sensor gone"):
        sampler.start()
        sampler.stop()
    assert sampler.status() == "failed: OSError: sensor gone"


def test_a_sampler_that_cannot_open_warns_and_keeps_the_reason() -> None:
    class NoOpen(ThreadSampler):
        name = "noopen"

        def _open(self) -> None:
            raise PermissionError("no /proc")

        def figures(self) -> dict[str, Any]:
            return {}

    sampler = NoOpen(hz=100)
    with pytest.warns(RuntimeWarning, match="no /proc"):
        sampler.start()
        sampler.stop()
    assert sampler.status() == "failed: PermissionError: no /proc"
