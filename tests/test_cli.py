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
                 "--batches", "3", "--rounds", "2", "--warmup", "1", "--threads", "1", "--set",
                 "pipeline.image[1].size=32", "--json", str(out), "--quiet", "--compare", "torch"])
    assert code == 0
    res = json.loads(out.read_text())
    for key in ("samples_per_s", "mb_per_s", "batches", "samples", "time_to_first_batch_s", "cpu_util",
                "peak_rss_mb", "skipped", "padded", "rounds", "round_samples_per_s"):
        assert key in res, key
    # 23 samples in batches of 4: an untimed first batch, then per round 1 warm-up batch and 3 timed ones;
    # round 2's warm-up takes the epoch's last batch (3 samples), so it times the next epoch's first three
    assert res["batches"] == 6 and res["samples"] == 24 and res["rounds"] == 2 and res["samples_per_s"] > 0
    c = res["compare"]
    assert c["baseline"] == "torch" and c["samples_per_s"] > 0 and c["batches"] == 6
    assert c["order"] == [["feedfast", "torch"], ["torch", "feedfast"]]
    assert len(c["ratio_spread"]["ratios"]) == 2 and c["ratio"] == pytest.approx(c["ratio_spread"]["median"])
    assert c["peak_rss_mb"] > 0 and "RandomResizedCrop(size=(32, 32)" in c["recipe"]
    assert c["warmup_per_round"] == 1 * 2 + 1  # drains one worker's two prefetched batches, then one more
    text = capsys.readouterr().out
    assert "ratio feedfast/torch" in text and "2 rounds)" in text and "torch first in round 2" in text


def test_bench_compare_alternates_which_loader_runs_first(shards: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from feedfast.baseline.contenders import Contender
    from feedfast.cli import bench

    events: list[str] = []
    real_run, real_first = bench.timed_run, Contender.first_batch

    def timed_run(batches, plan, **kw):  # type: ignore[no-untyped-def]
        events.append(plan.label)
        return real_run(batches, plan, **kw)

    def first_batch(self):  # type: ignore[no-untyped-def]
        events.append(f"first {self.name}")
        return real_first(self)

    def settle(cpu_seconds, **kw):  # type: ignore[no-untyped-def]
        events.append("settle")
        return 0.0

    monkeypatch.setattr(bench, "timed_run", timed_run)
    monkeypatch.setattr(bench, "settle", settle)
    monkeypatch.setattr(Contender, "first_batch", first_batch)
    assert main(["bench", "imagenet-train", "--shards", ",".join(shards), "--batch-size", "4", "--batches", "1",
                 "--warmup", "0", "--threads", "1", "--set", "pipeline.image[1].size=32", "--quiet",
                 "--compare", "torch", "--rounds", "3", "--json", "-"]) == 0
    # every timed round starts once the other loader's queue refill is over
    rounds = ["feedfast 1/3", "torch 1/3", "torch 2/3", "feedfast 2/3", "feedfast 3/3", "torch 3/3"]
    assert events == ["first torch", "first feedfast", *(e for r in rounds for e in ("settle", r))]


def test_settle_waits_until_the_processes_go_quiet() -> None:
    from feedfast.cli.bench import settle

    now = [0.0]
    busy = iter([0.0, 0.5, 1.0, 1.4, 1.42, 9.0])  # CPU seconds at each reading: busy for three polls, then quiet

    def sleep(seconds: float) -> None:
        now[0] += seconds

    waited = settle(lambda: next(busy), cores=2, poll_s=0.25, clock=lambda: now[0], sleep=sleep)
    assert waited == 1.0  # four polls: the fourth used 0.02 s, under a tenth of 2 cores over 0.25 s
    now[0] = 0.0
    always = iter(range(100))
    assert settle(lambda: float(next(always)), cores=2, limit_s=2.0, clock=lambda: now[0], sleep=sleep) == 2.0


def test_bench_compare_dali(shards: list[str], tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    assert main(["bench", "imagenet-train", "--shards", ",".join(shards), "--batch-size", "4", "--batches", "2",
                 "--rounds", "2", "--warmup", "1", "--threads", "1", "--set", "pipeline.image[1].size=32",
                 "--compare", "dali", "--json", str(out), "--quiet"]) == 0
    c = json.loads(out.read_text())["compare"]
    assert c["baseline"] == "dali" and c["samples_per_s"] > 0 and c["ratio"] > 0
    assert c["recipe"].startswith("hand-written DALI (CPU, 1 threads)")


def test_bench_counts_delivered_samples_not_padding(shards: list[str], tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    assert main(["bench", "imagenet-train", "--shards", ",".join(shards), "--batch-size", "4", "--batches", "11",
                 "--warmup", "0", "--threads", "1", "--set", "pipeline.image[1].size=32", "--set",
                 "batch.last_batch=pad", "--json", str(out), "--quiet"]) == 0
    res = json.loads(out.read_text())
    # after the untimed first batch: batches 2-6 of epoch 0 and 1-6 of epoch 1, each epoch's last padded by 1
    assert res["batches"] == 11 and res["padded"] == 2 and res["samples"] == 44 - 2
    assert res["samples_per_s"] == pytest.approx(res["samples"] / res["wall_s"])


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


def test_timed_run_counts_what_the_loader_delivered() -> None:
    import torch

    from feedfast.cli.measure import RunPlan, timed_run

    counter = {"delivered": 0}

    def batches():  # type: ignore[no-untyped-def]
        while True:
            counter["delivered"] += 3  # 4 rows, one of them padding
            yield torch.zeros(4, 2), torch.zeros(4)

    plan = RunPlan(warmup=2, count=5, gpu=False)
    figs, _ = timed_run(batches(), plan, started=0.0, delivered=lambda: counter["delivered"])
    assert figs["batches"] == 5 and figs["samples"] == 15
    figs, _ = timed_run(batches(), plan, started=0.0)
    assert figs["samples"] == 20  # without a count: the rows


def test_ownership_charges_each_child_to_the_loader_that_started_it() -> None:
    from feedfast.cli.measure import Ownership

    owners = Ownership()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in {p.pid for p in owners.processes("torch")}
        assert {p.pid for p in owners.processes("feedfast")} == {owners.me.pid}
        assert child.pid in {p.pid for p in owners.processes("torch")}
    finally:
        child.kill()
        child.wait()


def test_combine_runs() -> None:
    from feedfast.cli.measure import combine_runs

    def run(rate: float, wall: float, stall: float | None) -> dict:
        return {"samples_per_s": rate, "batches": 10, "samples": int(rate * wall), "wall_s": wall,
                "time_to_first_batch_s": wall, "cpu_util": 50.0 * wall, "peak_rss_mb": 100.0 * wall,
                "stall_fraction": stall, "verdict": "x", "wait_ms_per_batch": None if stall is None else 10 * wall,
                "required_samples_per_s": None, "gpu_util": None, "gpu_status": "not sampled"}

    out = combine_runs([run(100.0, 1.0, 0.0), run(300.0, 3.0, 0.4), run(200.0, 2.0, None)])
    assert out["samples_per_s"] == 200.0 and out["round_samples_per_s"] == [100.0, 300.0, 200.0]
    assert out["batches"] == 30 and out["samples"] == 1400 and out["wall_s"] == 6.0 and out["batch_ms"] == 200.0
    assert out["cpu_util"] == round((50 + 450 + 200) / 6, 1) and out["peak_rss_mb"] == 300.0
    assert out["stall_fraction"] == pytest.approx(0.3) and out["verdict"] == "highly input-bound"
    assert out["time_to_first_batch_s"] == 1.0 and out["rounds"] == 3


def test_compare_rows_print_the_median_ratio_and_its_spread(capsys: pytest.CaptureFixture[str]) -> None:
    from feedfast.baseline.contenders import Contender
    from feedfast.cli.bench import _compare_rows, compare_figures

    def figs(rates: list[float]) -> dict:
        return {"samples_per_s": sorted(rates)[len(rates) // 2], "round_samples_per_s": rates, "rounds": len(rates),
                "batches": 4, "samples": 16, "wall_s": 1.0, "time_to_first_batch_s": 0.5, "cpu_util": 90.0,
                "peak_rss_mb": 700.0, "stall_fraction": None, "verdict": "no steps measured", "warmup_per_round": 3,
                "settle_s_per_round": [0.5] * len(rates)}

    base = Contender("torch", iter(()), 0.0, lambda: None, recipe="torchvision")
    runs = {"feedfast": figs([300.0, 200.0, 100.0, 400.0]), "torch": {**figs([100.0] * 4), "cpu_util": 45.0}}
    c = compare_figures(base, runs, step=False)
    assert c["ratio"] == 2.5 and c["order"][1] == ["torch", "feedfast"]
    rows = dict(_compare_rows(c))
    assert rows["ratio feedfast/torch"] == "2.50x (min 1.00, max 4.00; IQR 1.75-3.25; 4 rounds)"
    assert rows["round order"] == "feedfast first in rounds 1, 3; torch first in rounds 2, 4"
    assert rows["torch samples/s"] == "100.0 (median of 4 rounds)"
    assert rows["torch CPU / peak RSS"].startswith("45 % / 700 MB")
    # 16 samples in 1 s each, feedfast at 90 % of the machine's cores and torch at 45 %: half torch's per CPU second
    assert c["ratio_per_cpu_s"] == pytest.approx(0.5) and rows["ratio per CPU second"].startswith("0.50x (feedfast ")
