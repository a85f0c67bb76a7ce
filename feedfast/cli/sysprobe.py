"""What ``feedfast doctor`` looks at: versions, GPUs, the JPEG hardware decoder, CPU, memory, cache.

Each probe returns JSON-safe data and never raises for a missing part: a package that is
not installed, a machine without a GPU or a failing driver call is reported as such, with
the reason, in the returned value.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from feedfast._env import usable_cores
from feedfast.errors import UserError
from feedfast.meter.nvml import nvml_init_failure

NOT_INSTALLED = "not installed"


def _dist_version(*names: str) -> tuple[str, str] | None:
    """(distribution name, version) of the first of ``names`` that is installed."""
    for name in names:
        try:
            return md.metadata(name)["Name"], md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def _module_version(module: str) -> str:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        return f"{NOT_INSTALLED} ({exc})"
    return str(getattr(mod, "__version__", "unknown"))


def pil_info() -> dict[str, Any]:
    """PIL's version, which distribution provides it, and its JPEG library.

    Pillow-SIMD is told by its distribution name (``pillow-simd`` in the installed
    metadata), which is reliable; its version carrying ``.post`` is the cross-check (Pillow
    itself never publishes ``.post`` versions). ``PIL.features`` cannot tell: it reports
    libjpeg-turbo, which both use.
    """
    try:
        import PIL
        from PIL import features
    except ImportError as exc:
        return {"version": f"{NOT_INSTALLED} ({exc})", "distribution": None, "simd": False}
    dist = _dist_version("pillow-simd", "Pillow")
    name = dist[0] if dist else "unknown"
    return {
        "version": PIL.__version__, "distribution": name,
        "simd": name.lower() == "pillow-simd", "version_has_post": ".post" in PIL.__version__,
        "libjpeg_turbo": features.version_feature("libjpeg_turbo") if features.check_feature("libjpeg_turbo") else None,
    }


def versions() -> dict[str, Any]:
    """Versions of feedfast, Python and the libraries the loader runs on."""
    import feedfast

    wds = _dist_version("webdataset")
    return {
        "feedfast": feedfast.__version__, "python": platform.python_version(), "executable": sys.executable,
        "platform": platform.platform(),
        "torch": _module_version("torch"), "dali": _module_version("nvidia.dali"),
        "webdataset": wds[1] if wds else NOT_INSTALLED, "pil": pil_info(),
    }


def _nvml() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        return {"status": "nvidia-ml-py is not installed", "driver": None, "gpus": []}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"status": nvml_init_failure(exc), "driver": None, "gpus": []}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as exc:
        return {"status": f"NVML query failed: {exc}", "driver": None, "gpus": []}
    finally:
        pynvml.nvmlShutdown()
    return {"status": "ok", "driver": _text(driver), "gpus": [_text(g) for g in gpus]}


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def cuda() -> dict[str, Any]:
    """CUDA as torch sees it and the driver and GPUs as NVML sees them."""
    import torch

    available = bool(torch.cuda.is_available())
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if available else []
    return {"available": available, "torch_cuda": torch.version.cuda, "gpus": gpus or "none", "nvml": _nvml()}


def hw_jpeg_decoder(has_gpu: bool, jpeg: bytes) -> str:
    """Whether the GPU's hardware JPEG decoder works, by decoding ``jpeg`` with it alone.

    DALI's ``mixed`` decoders decode through nvImageCodec and use the hardware decoder when
    ``hw_decoder_load`` > 0 and the GPU has one, silently falling back otherwise; so the
    reliable test is nvImageCodec's hardware-only backend, which returns no image when
    there is no hardware decoder.
    """
    if not has_gpu:
        return "no GPU"
    try:
        from nvidia import nvimgcodec
    except ImportError:
        return "unknown: nvImageCodec is not installed (pip install nvidia-nvimgcodec-cu12)"
    try:
        backend = nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)
        image = nvimgcodec.Decoder(backends=[backend]).decode(nvimgcodec.CodeStream(jpeg))
    except Exception as exc:  # noqa: BLE001 - a third-party failure is the answer here, reported in full
        return f"unknown: nvImageCodec failed: {type(exc).__name__}: {exc}"
    if image is None:
        return "no: nvImageCodec's hardware-only backend decoded nothing (this GPU has no JPEG engine)"
    return "yes: nvImageCodec's hardware-only backend decoded a test JPEG (DALI uses it with hw_decoder_load > 0)"


def _cgroup_cpus() -> float | None:
    """The CPU quota of this cgroup in cores (v2 ``cpu.max`` or v1 CFS), None when unlimited or unknown."""
    for quota_file, period_file in (("/sys/fs/cgroup/cpu.max", None),
                                    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
        try:
            parts = Path(quota_file).read_text().split()
            period = Path(period_file).read_text().split() if period_file else parts[1:2]
        except OSError:
            continue  # this cgroup version's file is absent: try the other
        if parts[0] in ("max", "-1") or not period:
            return None
        return int(parts[0]) / int(period[0])
    return None


def cpu() -> dict[str, Any]:
    """Physical and logical cores, the affinity mask, the cgroup quota and the usable count."""
    import psutil

    quota = _cgroup_cpus()
    usable = usable_cores() if quota is None else max(1, min(usable_cores(), int(quota)))
    return {"physical": psutil.cpu_count(logical=False), "logical": psutil.cpu_count(logical=True),
            "affinity": usable_cores(), "cgroup_quota": quota, "usable": usable, "model": _cpu_model()}


def _cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or None  # not Linux
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
    return names[0] if names else platform.processor() or None


def memory() -> dict[str, Any]:
    """RAM and the free space of ``/dev/shm`` (where ``analyze`` stages shards), MB."""
    import psutil

    vm = psutil.virtual_memory()
    shm = shutil.disk_usage("/dev/shm").free / 1e6 if os.path.isdir("/dev/shm") else None
    return {"total_mb": vm.total / 1e6, "available_mb": vm.available / 1e6, "shm_free_mb": shm}


def cache_folder() -> dict[str, Any]:
    """The cache folder (``feedfast._env.cache_dir()``) and whether a file can be written there."""
    from feedfast import _env

    try:
        path = _env.cache_dir()
    except UserError as exc:
        return {"path": os.environ.get("FEEDFAST_CACHE") or os.environ.get("XDG_CACHE_HOME"), "writable": False,
                "reason": str(exc)}
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
    except OSError as exc:
        return {"path": str(path), "writable": False, "reason": f"{type(exc).__name__}: {exc.strerror or exc}"}
    return {"path": str(path), "writable": True, "reason": None}

