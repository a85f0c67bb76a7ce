"""``feedfast doctor``: what this machine offers an input pipeline, and what would limit it.

Versions, CUDA and GPUs, the hardware JPEG decoder, cores, memory, the cache folder, the SIMD
level PIL was compiled for and its codecs, and a one-second PIL decode micro-benchmark that
turns the core count into an image rate. Problems (a missing image codec) come with their fix.
"""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path
from typing import Any

from feedfast.baseline.measure import pil_decode_ms
from feedfast.cli import sysprobe
from feedfast.cli.common import check_positive, table, write_json

EXAMPLES = """examples:
  feedfast doctor
  feedfast doctor --json              # the report as JSON on stdout
  feedfast doctor --json doctor.json  # ... or in a file
"""

BENCH_SIZE = (500, 375)
"""The micro-benchmark's image: ImageNet's most common size."""


def add_parser(sub: Any) -> None:
    """Register ``feedfast doctor``."""
    p = sub.add_parser("doctor", help="check this machine: versions, GPU, decoders, cores, cache", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Check this machine: versions, CUDA and GPUs, the hardware JPEG decoder, cores, "
                                   "memory, the cache folder,\nand what would limit throughput (from a 1 s PIL decode "
                                   "micro-benchmark).")
    p.add_argument("--json", dest="json_path", nargs="?", const="-", default=None, metavar="PATH",
                   help="write the report as JSON (to stdout without PATH)")
    p.add_argument("--decode-seconds", type=float, default=1.0, help="length of the decode micro-benchmark (1 s)")
    p.set_defaults(func=run)


def sample_jpeg() -> bytes:
    """A photo-like synthetic JPEG of :data:`BENCH_SIZE` at quality 90 (deterministic)."""
    import numpy as np

    from feedfast.write.synth import make_image

    buf = io.BytesIO()
    make_image(np.random.default_rng(0), *BENCH_SIZE).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


_PRODUCER = re.compile(rb"GNU C[0-9+]* [0-9.]+ ([ -~]{0,400})")
_LEVELS = (("-mavx512", "AVX-512"), ("-mavx2", "AVX2"), ("-mavx", "AVX"), ("-msse4", "SSE4"))


def cpu_simd() -> list[str]:
    """The SIMD extensions this CPU offers that pillow-simd can use (from /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    return [name for flag, name in (("sse4_1", "SSE4"), ("avx2", "AVX2"), ("avx512f", "AVX-512")) if flag in flags]


def pil_simd_level(module_path: str | None = None) -> dict[str, Any]:
    """The SIMD level PIL's C module was compiled for, read from the compiler flags it records.

    GCC writes its command-line flags into the debug information (``DW_AT_producer``, e.g.
    ``GNU C17 12.2.0 -mavx2 -msse4 ... -O3``); pillow-simd built from source keeps them. A
    stripped module, or one built by another compiler, records none: the level is then
    ``unknown`` and the report says so rather than guess.
    """
    if module_path is None:
        try:
            from PIL import _imaging

            module_path = str(_imaging.__file__)
        except ImportError as exc:
            return {"level": "unknown", "how": f"PIL's C module cannot be imported ({exc})", "flags": None}
    try:
        data = Path(module_path).read_bytes()
    except OSError as exc:
        return {"level": "unknown", "how": f"cannot read {module_path} ({exc})", "flags": None}
    producers = {m.group(0).decode("ascii", "replace") for m in _PRODUCER.finditer(data)}
    if not producers:
        return {"level": "unknown", "how": f"{Path(module_path).name} records no compiler flags (stripped, or "
                                           "not built by GCC); its SIMD level cannot be told", "flags": None}
    flags = " ".join(sorted(producers))
    level = next((name for flag, name in _LEVELS if flag in flags), "none (no -msse4/-mavx flags)")
    return {"level": level, "how": f"compiler flags recorded in {Path(module_path).name}", "flags": flags[:300]}


def decode_benchmark(jpeg: bytes, seconds: float, usable_cores: int) -> dict[str, Any]:
    """Images per second one core decodes (PIL), and the linear estimate for ``usable_cores``."""
    per_core = 1e3 / pil_decode_ms([jpeg], seconds=seconds)
    return {"what": f"PIL decode micro-benchmark: {seconds:g} s decoding one synthetic {BENCH_SIZE[0]}x{BENCH_SIZE[1]} "
                    f"JPEG (q90, {len(jpeg) / 1e3:.0f} kB) on 1 thread",
            "img_per_s_per_core": per_core, "cores": usable_cores, "img_per_s": per_core * usable_cores}


def collect(decode_seconds: float = 1.0) -> dict[str, Any]:
    """The whole report as JSON-safe data."""
    jpeg = sample_jpeg()
    cuda = sysprobe.cuda()
    cpu = sysprobe.cpu()
    report: dict[str, Any] = {
        "versions": sysprobe.versions(), "cuda": cuda,
        "hw_jpeg_decoder": sysprobe.hw_jpeg_decoder(cuda["available"], jpeg),
        "cpu": cpu, "memory": sysprobe.memory(), "cache": sysprobe.cache_folder(),
        "simd": {"cpu": cpu_simd(), "pil": pil_simd_level()}, "pil_codecs": _codecs(), "native": native_ext(),
        "decode_benchmark": decode_benchmark(jpeg, decode_seconds, cpu["usable"]),
    }
    report["limits"] = limits(report)
    report["problems"] = problems(report)
    return report


def problems(r: dict[str, Any]) -> list[dict[str, str]]:
    """What makes feedfast deliver less than it should here, each with its fix: a PIL without an image codec
    loses the images only that codec reads (DALI cannot read them all)."""
    from feedfast.checks.decoders import IMAGE_CODECS

    codecs = r.get("pil_codecs", {})
    missing = [name for name in IMAGE_CODECS if name in codecs and not codecs[name]["present"]]
    if not missing:
        return []
    if r["versions"]["pil"].get("simd"):
        fix = (f"install the headers (apt-get update && apt-get install {' '.join(IMAGE_CODECS[n] for n in missing)}) "
               "and rebuild pillow-simd: CC=\"cc -mavx2\" pip install --force-reinstall --no-deps --no-binary "
               "pillow-simd --no-cache-dir pillow-simd (make setup does both)")
    else:
        fix = "pip install --force-reinstall --no-deps Pillow (its wheels hold every codec)"
    return [{"problem": f"this PIL has no {name} codec: {codecs[name]['reads']} images it alone reads are left out "
                        "(on_error: skip) or raised (on_error: raise)", "fix": fix} for name in missing]


def native_ext() -> dict[str, Any]:
    """Whether feedfast's C extensions are built (JPEG region decoding, the resize, normalize; the batch planner;
    the recipe ops' sub-ops on arrays), against which libjpeg, and whether the threaded path makes a planned chunk
    in one call of the extension."""
    from feedfast.loader.backends.cpu import batchplan, native
    from feedfast.ops import autoaug_arrays

    return {"built": native.built(), "libjpeg_turbo": native.libjpeg_turbo_version(),
            "planner": batchplan.ext is not None, "one_call": batchplan.one_call(),
            "augment": autoaug_arrays.kernels_built()}


def _codecs() -> dict[str, dict[str, Any]]:
    """{PIL codec: {present, reads}} (empty without PIL)."""
    try:
        from feedfast.checks.decoders import pil_codecs
    except ImportError:
        return {}
    try:
        return {name: {"present": present, "reads": what} for name, (present, what) in pil_codecs().items()}
    except ImportError:  # no PIL
        return {}


def limits(r: dict[str, Any]) -> list[str]:
    """What would limit throughput here, most important first."""
    cpu, bench, cuda = r["cpu"], r["decode_benchmark"], r["cuda"]
    out = [f"{cpu['usable']} core{'s' if cpu['usable'] != 1 else ''}: CPU decode tops out near "
           f"{bench['img_per_s']:.0f} img/s ({bench['img_per_s_per_core']:.0f} img/s per core by the "
           f"{BENCH_SIZE[0]}x{BENCH_SIZE[1]} PIL decode micro-benchmark, times {cpu['usable']} cores; "
           "ROI decode and augmentation move it either way)"]
    if not cuda["available"]:
        out.append("no GPU: no GPU decode (nvJPEG) and no hardware JPEG decoder; pipelines run on the CPU")
    elif not r["hw_jpeg_decoder"].startswith("yes"):
        out.append(f"GPU decode runs on CUDA cores only (hardware JPEG decoder: {r['hw_jpeg_decoder']})")
    if cpu["cgroup_quota"] is not None and cpu["cgroup_quota"] < cpu["affinity"]:
        out.append(f"the cgroup allows {cpu['cgroup_quota']:g} cores of the {cpu['affinity']} visible: "
                   "size --threads to the quota")
    if str(r["versions"]["dali"]).startswith(sysprobe.NOT_INSTALLED):
        out.append("DALI is not installed: feedfast cannot build its pipelines (pip install feedfast[cuda12])")
    if not r["versions"]["pil"].get("simd"):
        out.append("Pillow without SIMD: the PIL baseline (bench --compare torch) resizes slower; "
                   "pip install pillow-simd")
    simd = r["simd"]
    if r["versions"]["pil"].get("simd") and "AVX2" in simd["cpu"] and simd["pil"]["level"] in ("SSE4", "AVX"):
        out.append(f"pillow-simd was built for {simd['pil']['level']} on a CPU with AVX2: its resizes run slower than "
                   "they could; rebuild: CC=\"cc -mavx2\" pip install --force-reinstall --no-deps --no-binary :all: "
                   "--no-cache-dir pillow-simd")
    if not r.get("native", {}).get("built", True) or not r.get("native", {}).get("planner", True):
        out.append("feedfast's C extensions are not built: the threaded CPU path walks each sample in Python, decodes "
                   "whole JPEG rows and normalizes in NumPy (several times slower); install libjpeg-turbo's headers "
                   "(apt-get install libjpeg-dev) and reinstall feedfast")
    if r.get("native", {}).get("built") and not r["native"].get("augment", True):
        out.append("feedfast._augment is not built: the recipe ops' rotate, shear, autocontrast and equalize run "
                   "through Pillow on the threaded path, slower; reinstall feedfast where a C compiler is found")
    if not r["cache"]["writable"]:
        out.append(f"cache folder not writable ({r['cache']['reason']}): shard indexes are rebuilt on every run")
    return out


def run(args: argparse.Namespace) -> int:
    """Print (or write as JSON) the report."""
    check_positive("decode-seconds", args.decode_seconds)
    report = collect(args.decode_seconds)
    if args.json_path is not None:
        write_json(args.json_path, report)
        if args.json_path == "-":
            return 0
    _print(report)
    return 0


def _print(r: dict[str, Any]) -> None:
    v, c, cpu, mem, cache = r["versions"], r["cuda"], r["cpu"], r["memory"], r["cache"]
    pil = v["pil"]
    simd = "pillow-simd" if pil.get("simd") else f"not SIMD ({pil.get('distribution')})"
    state = "writable" if cache["writable"] else f"NOT writable: {cache['reason']}"
    gpus = ", ".join(c["gpus"]) if isinstance(c["gpus"], list) else c["gpus"]
    shm = "n/a" if mem["shm_free_mb"] is None else f"{mem['shm_free_mb'] / 1e3:.1f} GB free"
    rows = [
        ("feedfast", v["feedfast"]), ("python", f"{v['python']} ({v['executable']})"), ("torch", v["torch"]),
        ("DALI", v["dali"]), ("webdataset", v["webdataset"]),
        ("PIL", f"{pil['version']}, {simd}, libjpeg-turbo {pil.get('libjpeg_turbo') or 'no'}"),
        ("PIL SIMD build", f"{r['simd']['pil']['level']} ({r['simd']['pil']['how']}); "
                           f"CPU offers {', '.join(r['simd']['cpu']) or 'none known'}"),
        ("feedfast C ext", f"built, libjpeg-turbo {r['native']['libjpeg_turbo']} (JPEG region decode, resize, "
                           f"normalize; a planned chunk in one call: {'yes' if r['native'].get('one_call') else 'no'}; "
                           f"recipe sub-ops on arrays: {'yes' if r['native'].get('augment') else 'NO'})"
                           if r["native"]["built"] else "NOT built: Pillow and NumPy do its work, slower"),
        ("CUDA", f"{'available' if c['available'] else 'not available'} (torch CUDA {c['torch_cuda'] or 'none'})"),
        ("driver", c["nvml"]["driver"] or f"none ({c['nvml']['status']})"), ("GPUs", gpus),
        ("HW JPEG decoder", r["hw_jpeg_decoder"]),
        ("CPU cores", f"{cpu['physical']} physical, {cpu['logical']} logical, {cpu['affinity']} in affinity, "
                      f"cgroup quota {cpu['cgroup_quota'] if cpu['cgroup_quota'] is not None else 'none'}"),
        ("memory", f"{mem['total_mb'] / 1e3:.1f} GB, {mem['available_mb'] / 1e3:.1f} GB available; /dev/shm {shm}"),
        ("cache folder", f"{cache['path']} ({state})"),
        ("PIL codecs", ", ".join(f"{n} {'yes' if c['present'] else 'NO'}" for n, c in r.get("pil_codecs", {}).items())
         or "unknown (no PIL)"),
        ("decode", r["decode_benchmark"]["what"]),
    ]
    print("feedfast doctor\n" + table(rows))
    if r["problems"]:
        print("problems:")
        for p in r["problems"]:
            print(f"  - {p['problem']}\n    fix: {p['fix']}")
    print("what would limit throughput here:")
    for line in r["limits"]:
        print(f"  - {line}")
