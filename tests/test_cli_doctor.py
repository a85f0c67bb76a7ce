"""``feedfast doctor``: the report's fields, its JSON forms, and how it reports what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from feedfast.checks.decoders import IMAGE_CODECS, PIL_CODECS
from feedfast.cli import sysprobe
from feedfast.cli.doctor import collect, limits, pil_simd_level, problems, sample_jpeg
from feedfast.cli.main import main

FAST = ["--decode-seconds", "0.05"]


def test_doctor_json_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json", *FAST]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep) == {"versions", "cuda", "hw_jpeg_decoder", "cpu", "memory", "cache", "simd", "decode_benchmark",
                        "limits", "pil_codecs", "native", "problems"}
    assert rep["native"] == {"built": True, "libjpeg_turbo": rep["native"]["libjpeg_turbo"], "planner": True,
                             "one_call": rep["native"]["one_call"], "augment": True}
    assert not any("C extension" in line for line in rep["limits"])
    assert rep["pil_codecs"]["jpg"]["present"] is True and "zlib" in rep["pil_codecs"]
    missing = [name for name in IMAGE_CODECS if not rep["pil_codecs"][name]["present"]]
    assert missing == [] and rep["problems"] == [], "make setup builds pillow-simd with libtiff, OpenJPEG and libwebp"
    assert rep["simd"]["pil"]["level"] in ("AVX-512", "AVX2", "AVX", "SSE4", "none (no -msse4/-mavx flags)", "unknown")
    v = rep["versions"]
    for key in ("feedfast", "python", "torch", "dali", "webdataset"):
        assert isinstance(v[key], str) and v[key], key
    assert isinstance(v["pil"]["simd"], bool) and v["pil"]["distribution"] in ("pillow-simd", "Pillow")
    assert v["pil"]["simd"] == (v["pil"]["distribution"] == "pillow-simd")
    assert rep["cuda"]["available"] == torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert rep["cuda"]["gpus"] == "none" and rep["hw_jpeg_decoder"] == "no GPU"
        assert any(line.startswith("no GPU") for line in rep["limits"])
    cpu = rep["cpu"]
    assert 1 <= cpu["usable"] <= cpu["affinity"] <= cpu["logical"]
    assert rep["memory"]["total_mb"] >= rep["memory"]["available_mb"] > 0
    assert rep["cache"]["writable"] is True
    bench = rep["decode_benchmark"]
    assert bench["img_per_s"] == pytest.approx(bench["img_per_s_per_core"] * cpu["usable"])
    assert "micro-benchmark" in bench["what"]
    assert f"{cpu['usable']} core" in rep["limits"][0] and "img/s" in rep["limits"][0]


def test_doctor_text_and_json_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.json"
    assert main(["doctor", "--json", str(out), *FAST]) == 0
    text = capsys.readouterr().out
    assert "what would limit throughput here:" in text and "HW JPEG decoder" in text and "PIL SIMD build" in text
    assert json.loads(out.read_text())["versions"]["feedfast"]


def test_unwritable_cache_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FEEDFAST_CACHE", str(blocker / "cache"))
    cache = sysprobe.cache_folder()
    assert cache["writable"] is False and cache["reason"]


def test_limits_name_each_problem() -> None:
    rep = {
        "cpu": {"usable": 1, "affinity": 4, "cgroup_quota": 1.5},
        "decode_benchmark": {"img_per_s": 300.0, "img_per_s_per_core": 300.0},
        "cuda": {"available": True}, "hw_jpeg_decoder": "no: ...",
        "versions": {"dali": "not installed (No module named 'nvidia')", "pil": {"simd": False}},
        "cache": {"writable": False, "reason": "PermissionError"},
        "simd": {"cpu": ["SSE4", "AVX2"], "pil": {"level": "SSE4"}},
    }
    text = "\n".join(limits(rep))
    for needle in ("1 core: CPU decode tops out near 300 img/s", "CUDA cores only", "cgroup allows 1.5 cores",
                   "DALI is not installed", "pillow-simd", "cache folder not writable"):
        assert needle in text, needle


def test_pillow_simd_built_without_avx2_on_an_avx2_cpu_is_a_limit() -> None:
    rep = {
        "cpu": {"usable": 2, "affinity": 2, "cgroup_quota": None},
        "decode_benchmark": {"img_per_s": 300.0, "img_per_s_per_core": 150.0},
        "cuda": {"available": False}, "hw_jpeg_decoder": "no GPU",
        "versions": {"dali": "2.4.0", "pil": {"simd": True}}, "cache": {"writable": True},
        "simd": {"cpu": ["SSE4", "AVX2"], "pil": {"level": "SSE4"}},
    }
    assert any("built for SSE4 on a CPU with AVX2" in line and "-mavx2" in line for line in limits(rep))
    rep["simd"]["pil"]["level"] = "AVX2"
    assert not any("AVX2" in line for line in limits(rep))


@pytest.mark.parametrize("simd", [True, False])
def test_a_missing_image_codec_is_a_problem_with_its_fix(simd: bool, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    codecs = {name: {"present": name not in ("libtiff", "jpg_2000"), "reads": what} for name, what in PIL_CODECS.items()}
    rep = {"versions": {"pil": {"simd": simd}}, "pil_codecs": codecs}
    found = problems(rep)
    assert [p["problem"].split(":")[0] for p in found] == ["this PIL has no libtiff codec",
                                                            "this PIL has no jpg_2000 codec"]
    assert "LZMA" in found[0]["problem"] and "left out" in found[0]["problem"]
    if simd:
        assert "apt-get install libtiff-dev libopenjp2-7-dev" in found[0]["fix"] and "pillow-simd" in found[0]["fix"]
    else:
        assert "pip install --force-reinstall --no-deps Pillow" in found[0]["fix"]
    assert problems({**rep, "pil_codecs": {n: {**c, "present": True} for n, c in codecs.items()}}) == []
    real = collect
    monkeypatch.setattr("feedfast.cli.doctor.collect", lambda seconds: {**real(seconds), "problems": found})
    assert main(["doctor", *FAST]) == 0
    assert "problems:\n  - this PIL has no libtiff codec" in capsys.readouterr().out


def _module_with(tmp_path: Path, producer: bytes) -> str:
    path = tmp_path / "_imaging.so"
    path.write_bytes(b"\x7fELF\x00junk\x00" + producer + b"\x00more\x00")
    return str(path)


@pytest.mark.parametrize("producer,level", [
    (b"GNU C17 12.2.0 -mavx2 -msse4 -mtune=generic -march=x86-64 -g -O3", "AVX2"),
    (b"GNU C17 12.2.0 -msse4 -mtune=generic -march=x86-64 -g -O3", "SSE4"),
    (b"GNU C17 12.2.0 -mtune=generic -march=x86-64 -O2", "none (no -msse4/-mavx flags)"),
    (b"", "unknown"),
])
def test_pil_simd_level_reads_the_recorded_compiler_flags(tmp_path: Path, producer: bytes, level: str) -> None:
    found = pil_simd_level(_module_with(tmp_path, producer))
    assert found["level"] == level
    if level == "unknown":
        assert "cannot be told" in found["how"]
    assert pil_simd_level(str(tmp_path / "missing.so"))["level"] == "unknown"


def test_hw_decoder_probe_without_gpu_says_so() -> None:
    assert sysprobe.hw_jpeg_decoder(False, b"") == "no GPU"
    assert sample_jpeg()[:2] == b"\xff\xd8"


@pytest.mark.gpu
def test_hw_decoder_probe_on_a_gpu_answers() -> None:
    answer = sysprobe.hw_jpeg_decoder(True, sample_jpeg())
    assert answer.split(":")[0] in ("yes", "no"), answer


def test_doctor_rejects_bad_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--decode-seconds", "0"]) == 2
    assert "--decode-seconds must be > 0" in capsys.readouterr().err


def test_internal_failure_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(decode_seconds: float = 1.0) -> dict:
        raise RuntimeError("probe exploded")

    monkeypatch.setattr("feedfast.cli.doctor.collect", broken)
    assert main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: probe exploded" in err and "Traceback" not in err
