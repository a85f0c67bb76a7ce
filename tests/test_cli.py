"""The feedfast command: figures in JSON, exit 0 on success and 2 on user mistakes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from feedfast.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_bench_writes_figures(shards: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.json"
    code = main(["bench", str(ROOT / "pipelines/imagenet-train.yaml"), "--shards", ",".join(shards), "--batch-size", "4",
                 "--batches", "4", "--warmup", "1", "--threads", "1", "--set", "pipeline.image[1].size=32",
                 "--json", str(out), "--quiet", "--compare", "torch"])
    assert code == 0
    res = json.loads(out.read_text())
    for key in ("samples_per_s", "mb_per_s", "batches", "samples", "time_to_first_batch_s", "cpu_util",
                "peak_rss_mb", "skipped", "padded"):
        assert key in res, key
    assert res["batches"] == 4 and res["samples"] == 16 and res["samples_per_s"] > 0
    assert res["compare"]["samples_per_s"] > 0 and res["compare"]["ratio"] > 0
    assert "ratio feedfast/torch" in capsys.readouterr().out


def test_bench_step_reports_stall_and_plots(shards: list[str], tmp_path: Path) -> None:
    out, png = tmp_path / "b.json", tmp_path / "wait.png"
    code = main(["bench", "imagenet-train", "--shards", ",".join(shards), "--batch-size", "4", "--batches", "3",
                 "--warmup", "1", "--threads", "1", "--set", "pipeline.image[1].size=32", "--step-ms", "5",
                 "--plot", str(png), "--json", str(out), "--quiet"])
    assert code == 0
    res = json.loads(out.read_text())
    assert res["gpu_util"] is None or 0 <= res["gpu_util"] <= 100
    assert isinstance(res["gpu_status"], str)
    step = res["step"]
    for key in ("step_ms", "stall_fraction", "verdict", "required_samples_per_s", "recommendation"):
        assert key in step, key
    assert step["step_ms"] == 5 and step["required_samples_per_s"] == pytest.approx(4 * 1000 / 5)
    assert 0 <= step["stall_fraction"] <= 1 and step["verdict"].endswith("input-bound")
    assert step["measured_step_ms"] >= 5.0 and isinstance(step["recommendation"], str) and step["recommendation"]
    assert res["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv,needle", [
    (["bench", "no-such-spec.yaml"], "spec not found: 'no-such-spec.yaml'"),
    (["bench", "imagenet-train", "--shards", "/nope/train-{0000..0003}.tar"], "shard not found: '/nope/train-0000.tar'"),
    (["bench", "imagenet-train", "--shards", "/tmp/feedfast-none-*.tar"], "no shard matches '/tmp/feedfast-none-*.tar'"),
    (["bench", "imagenet-train", "--shards", "x.tar", "--batches", "0"], "--batches must be > 0"),
    (["plan", "imagenet-train", "--set", "pipeline.image[1].size=big"], "pipeline.image[1].size"),
    (["bench", "--batches", "many"], "invalid int value"),
    (["bench", "--batches", "3", "--seconds", "2"], "argument --seconds: not allowed with argument --batches"),
    (["bench", "imagenet-train", "--shards", "x.tar", "--step-ms", "-1"], "--step-ms must be > 0, got -1"),
    (["bench", "imagenet-train", "--shards", "x.tar", "--plot", "/nope/dir/w.png"], "--plot '/nope/dir/w.png'"),
    (["doctor", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_user_mistakes_exit_2_with_one_line(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_plan_json_lists_dali_ops_and_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "imagenet-train", "--device", "gpu", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    ops = {n["op"]: n["device"] for n in plan["nodes"]}
    assert ops["decoders.image_random_crop+resize"] == "mixed"
    assert ops["crop_mirror_normalize"] == "gpu"


def test_shards_synth_index_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ds"
    assert main(["shards", "synth", str(out), "--samples", "6", "--per-shard", "4", "--min-side", "40",
                 "--max-side", "50"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["train-0000.idx", "train-0000.tar", "train-0001.idx",
                                                     "train-0001.tar"]
    capsys.readouterr()
    assert main(["shards", "inspect", str(out / "*.tar"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 6 and report["components"] == {"jpg": 6, "cls": 6} and report["problems"] == []
    assert main(["shards", "index", str(out / "train-{0000..0001}.tar")]) == 0


def test_console_script_runs_as_a_module() -> None:
    proc = subprocess.run([sys.executable, "-m", "feedfast", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "bench" in proc.stdout and "plan" in proc.stdout
    assert "analyze" in proc.stdout and "doctor" in proc.stdout


@pytest.mark.parametrize("command", ["bench", "analyze", "doctor", "plan", "shards"])
def test_every_command_has_help_with_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and f"feedfast {command}" in text


def test_bench_on_error_skip_counts_and_lists_bad_samples(tmp_path: Path) -> None:
    from tests.corpus import BAD_KEYS, write_corpus

    shard = write_corpus(tmp_path / "corpus")
    out = tmp_path / "b.json"
    argv = ["bench", str(ROOT / "pipelines/imagenet-train.yaml"), "--shards", str(shard), "--batch-size", "2",
            "--batches", "2", "--warmup", "0", "--threads", "1", "--set", "pipeline.image[1].size=32",
            "--set", "source.missing=skip", "--json", str(out), "--quiet"]
    assert main(argv + ["--on-error", "raise"]) == 2  # the error names the shard and sample
    assert main(argv + ["--on-error", "skip"]) == 0
    res = json.loads(out.read_text())
    keys = {s["key"] for s in res["skipped_samples"]}
    assert set(BAD_KEYS) - {"bomb"} <= keys and res["skipped"] == len(keys) and res["converted"] == 1
