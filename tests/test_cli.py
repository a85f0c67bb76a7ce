"""The feedfast command: figures in JSON, exit 0 on success and 2 on user mistakes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from feedfast.cli.main import main

ROOT = Path(__file__).resolve().parents[1]



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


def test_timed_run_counts_what_the_loader_delivered() -> None:
    import torch

    from feedfast.baseline.measure import RunPlan, timed_run

    counter = {"delivered": 0}

    def batches():  # type: ignore[no-untyped-def]
        while True:
            counter["delivered"] += 3  # 4 rows, one of them padding
            yield torch.zeros(4, 2), torch.zeros(4)

    plan = RunPlan(warmup=2, count=5, gpu=False)
    figs, _ = timed_run(batches(), plan, started=0.0, delivered=lambda: counter["delivered"])
    assert figs["batches"] == 5 and figs["samples"] == 15 and figs["cpu_s"] >= 0
    figs, _ = timed_run(batches(), plan, started=0.0)
    assert figs["samples"] == 20  # without a count: the rows


def test_combine_runs() -> None:
    from feedfast.baseline.measure import combine_runs

    def run(rate: float, wall: float, stall: float | None) -> dict:
        return {"samples_per_s": rate, "batches": 10, "samples": int(rate * wall), "wall_s": wall, "cpu_s": wall / 2,
                "time_to_first_batch_s": wall, "cpu_util": 50.0 * wall, "peak_rss_mb": 100.0 * wall,
                "stall_fraction": stall, "verdict": "x", "wait_ms_per_batch": None if stall is None else 10 * wall,
                "required_samples_per_s": None, "gpu_util": None, "gpu_status": "not sampled"}

    out = combine_runs([run(100.0, 1.0, 0.0), run(300.0, 3.0, 0.4), run(200.0, 2.0, None)])
    assert out["samples_per_s"] == 200.0 and out["round_samples_per_s"] == [100.0, 300.0, 200.0]
    assert out["batches"] == 30 and out["samples"] == 1400 and out["wall_s"] == 6.0 and out["batch_ms"] == 200.0
    assert out["cpu_s"] == 3.0
    assert out["cpu_util"] == round((50 + 450 + 200) / 6, 1) and out["peak_rss_mb"] == 300.0
    assert out["stall_fraction"] == pytest.approx(0.3) and out["verdict"] == "highly input-bound"
    assert out["time_to_first_batch_s"] == 1.0 and out["rounds"] == 3
