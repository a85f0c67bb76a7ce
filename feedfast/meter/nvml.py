"""GPU sampler through NVML (``nvidia-ml-py``, imported lazily).

Figures: ``gpu_util`` / ``gpu_util_max`` (percent of time a kernel ran, NVML's
utilization rate), ``gpu_mem_mb`` / ``gpu_mem_max_mb`` (device memory used, MiB), and
``gpu_sm_active`` / ``gpu_sm_active_max`` (percent of SMs busy). SM activity is best
effort: it comes from NVML's GPU Performance Monitoring (GPM), which Hopper and newer
GPUs offer; elsewhere, or when GPM refuses, it is None and ``status()`` says why in
``sm_status``. Without the module, without NVML or without a GPU the sampler is
unavailable and every figure is None.
"""

from __future__ import annotations

import glob
import os
import sys
import warnings
from typing import Any

from feedfast.meter.samplers import Running, ThreadSampler, Unavailable

_MIB = 1024 * 1024
# Where a machine shows an NVIDIA GPU: its device files, or the driver's list of GPUs.
_GPU_MARKERS = ("/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*")
NO_GPU = "no GPU (no NVIDIA device or driver on this machine)"


def gpu_present(markers: tuple[str, ...] = _GPU_MARKERS) -> bool:
    """Whether this machine shows an NVIDIA GPU (a device file or the driver's GPU list).

    Tells "no GPU" apart from "a GPU NVML cannot reach" when NVML does not start; it reads
    the file system only, never CUDA or NVML.
    """
    return any(glob.glob(pattern) for pattern in markers)


def nvml_init_failure(exc: Exception) -> str:
    """Why NVML did not start: :data:`NO_GPU` on a machine without a GPU, else NVML's reason."""
    return f"NVML did not start: {exc}" if gpu_present(_GPU_MARKERS) else NO_GPU


def nvml_target(cuda_index: int, visible: str | None) -> tuple[int | None, str | None]:
    """The GPU NVML must sample for CUDA device ``cuda_index``: (NVML index, None) or (None, UUID).

    CUDA numbers only the devices ``CUDA_VISIBLE_DEVICES`` lists, in its order, while NVML
    numbers every GPU of the machine: with ``CUDA_VISIBLE_DEVICES=2,3``, ``cuda:1`` is NVML's
    GPU 3. Entries may be indexes or UUIDs (``GPU-...``, ``MIG-...``); CUDA stops at the first
    entry it cannot read, and so does this.

    Args:
        cuda_index: the CUDA device, as torch numbers it.
        visible: ``CUDA_VISIBLE_DEVICES``, or None when unset (every GPU, in NVML's order).

    Returns:
        (None, None) when ``visible`` lists no such device.
    """
    if visible is None:
        return cuda_index, None
    entries: list[tuple[int | None, str | None]] = []
    for entry in visible.split(","):
        entry = entry.strip()
        if entry.lstrip("-").isdigit():
            if int(entry) < 0:
                break
            entries.append((int(entry), None))
        elif entry.startswith(("GPU-", "MIG-")):
            entries.append((None, entry))
        else:
            break
    return entries[cuda_index] if 0 <= cuda_index < len(entries) else (None, None)


class NvmlSampler(ThreadSampler):
    """GPU utilization, memory and SM activity of one GPU.

    Args:
        index: NVML index of the GPU, when it is known (wins over ``cuda_index``); also
            what a UUID that finds no GPU falls back to.
        uuid: The GPU's UUID (``"GPU-..."``), which survives ``CUDA_VISIBLE_DEVICES``.
        cuda_index: The CUDA device to sample, as torch numbers it (default 0); the stall
            meter passes its own device's. It is found by its UUID when torch has initialized
            CUDA, else mapped through ``CUDA_VISIBLE_DEVICES`` (:func:`nvml_target`), never
            from the sampler thread's current device (always 0 on a new thread).
        hz: Samples per second.
    """

    name = "gpu"

    def __init__(self, *, index: int | None = None, uuid: str | None = None, cuda_index: int | None = None,
                 hz: float = 10.0) -> None:
        super().__init__(hz=hz)
        self._cuda_index = 0 if cuda_index is None else cuda_index
        self._index, self._uuid = index, uuid
        if index is None and uuid is None:
            self._index, self._uuid = nvml_target(self._cuda_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
        self._nvml: Any = None
        self._handle: Any = None
        self._gpm_prev: Any = None
        self.sm_status = "not started"
        self._util = Running()
        self._mem = Running()
        self._sm = Running()

    def _open(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise Unavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise Unavailable(nvml_init_failure(exc)) from exc
        self._nvml = pynvml
        try:
            self._handle = self._find_handle()
        except Unavailable:
            pynvml.nvmlShutdown()
            self._nvml = None
            raise
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            self._nvml = None
            where = f"NVML index {self._index}" if self._index is not None else f"UUID {self._uuid}"
            raise Unavailable(f"no GPU at {where} (CUDA device {self._cuda_index}): {exc}") from exc
        self._open_gpm()

    def _find_handle(self) -> Any:
        nvml = self._nvml
        uuid = self._uuid or _torch_gpu_uuid(self._cuda_index)
        if uuid is not None:
            try:
                return nvml.nvmlDeviceGetHandleByUUID(uuid)
            except nvml.NVMLError as exc:
                if self._index is None:
                    raise
                warnings.warn(
                    f"feedfast StallMeter: NVML found no GPU {uuid} ({exc}); "
                    f"sampling NVML index {self._index} instead",
                    RuntimeWarning,
                    stacklevel=1,
                )
        if self._index is None:
            raise Unavailable(f"CUDA device {self._cuda_index} is not among CUDA_VISIBLE_DEVICES="
                              f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}")
        return nvml.nvmlDeviceGetHandleByIndex(self._index)

    def _open_gpm(self) -> None:
        nvml = self._nvml
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice:
                self.sm_status = "unavailable: this GPU has no GPM (Hopper or newer)"
                return
            self._gpm_prev = nvml.nvmlGpmSampleGet(self._handle, nvml.nvmlGpmSampleAlloc())
            self.sm_status = "ok"
        except (nvml.NVMLError, AttributeError) as exc:
            self.sm_status = f"unavailable: GPM: {exc}"

    def _sample(self) -> None:
        nvml = self._nvml
        self._util.add(float(nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
        self._mem.add(nvml.nvmlDeviceGetMemoryInfo(self._handle).used / _MIB)
        if self._gpm_prev is not None:
            self._sample_sm()

    def _sample_sm(self) -> None:
        nvml = self._nvml
        try:
            current = nvml.nvmlGpmSampleGet(self._handle, nvml.nvmlGpmSampleAlloc())
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 1
            request.sample1 = self._gpm_prev
            request.sample2 = current
            request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as exc:
            self.sm_status = f"unavailable: GPM: {exc}"
            self._free(self._gpm_prev)
            self._gpm_prev = None
            return
        self._free(self._gpm_prev)
        self._gpm_prev = current
        self._sm.add(float(request.metrics[0].value))

    def _free(self, sample: Any) -> None:
        try:
            self._nvml.nvmlGpmSampleFree(sample)
        except self._nvml.NVMLError as exc:
            self.sm_status = f"ok (a GPM sample was not freed: {exc})"

    def _close(self) -> None:
        if self._nvml is None:
            return
        if self._gpm_prev is not None:
            self._free(self._gpm_prev)
            self._gpm_prev = None
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            self.sm_status += f" (NVML shutdown: {exc})"
        self._nvml = None

    def status(self) -> str:
        """The sampler's status, with SM activity's when it runs."""
        base = super().status()
        return f"{base}; sm: {self.sm_status}" if base == "ok" else base

    def figures(self) -> dict[str, Any]:
        """GPU figures so far; None when unavailable."""
        with self._lock:
            return {
                "gpu_util": self._util.mean,
                "gpu_util_max": self._util.max,
                "gpu_mem_mb": self._mem.mean,
                "gpu_mem_max_mb": self._mem.max,
                "gpu_sm_active": self._sm.mean,
                "gpu_sm_active_max": self._sm.max,
            }


def _torch_gpu_uuid(cuda_index: int) -> str | None:
    """The UUID of torch's GPU ``cuda_index`` when torch has already initialized CUDA, else None.

    Never initializes CUDA itself (this runs in the sampler thread, whose current device is
    not the training thread's: the index is given).
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        props = torch.cuda.get_device_properties(cuda_index)
    except RuntimeError as exc:
        warnings.warn(
            f"feedfast StallMeter: torch could not name its GPU ({exc}); NVML samples by index",
            RuntimeWarning,
            stacklevel=1,
        )
        return None
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"
