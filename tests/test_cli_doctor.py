"""``feedfast doctor``: the report's fields, its JSON forms, and how it reports what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from feedfast.cli import sysprobe
from feedfast.cli.doctor import limits, sample_jpeg
from feedfast.cli.main import main

FAST = ["--decode-seconds", "0.05"]


def test_doctor_json_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json", *FAST]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep) == {"versions", "cuda", "hw_jpeg_decoder", "cpu", "memory", "cache", "decode_benchmark", "limits"}
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
    assert "what would limit throughput here:" in text and "HW JPEG decoder" in text
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
    }
    text = "\n".join(limits(rep))
    for needle in ("1 core: CPU decode tops out near 300 img/s", "CUDA cores only", "cgroup allows 1.5 cores",
                   "DALI is not installed", "pillow-simd", "cache folder not writable"):
        assert needle in text, needle


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
