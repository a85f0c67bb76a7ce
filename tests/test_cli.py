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


@pytest.mark.parametrize("argv,needle", [
    (["bench", "no-such-spec.yaml"], "spec not found: 'no-such-spec.yaml'"),
    (["bench", "imagenet-train", "--shards", "/nope/train-{0000..0003}.tar"], "shard not found: '/nope/train-0000.tar'"),
    (["bench", "imagenet-train", "--shards", "/tmp/feedfast-none-*.tar"], "no shard matches '/tmp/feedfast-none-*.tar'"),
    (["bench", "imagenet-train", "--shards", "x.tar", "--batches", "0"], "--batches must be > 0"),
    (["plan", "imagenet-train", "--set", "pipeline.image[1].size=big"], "pipeline.image[1].size"),
    (["bench", "--batches", "many"], "invalid int value"),
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
