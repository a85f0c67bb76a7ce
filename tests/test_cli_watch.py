"""``feedfast watch``: unchanged jobs (tests/watch_jobs/) run under the meter, and the parts it is made of.

The jobs run as subprocesses of ``feedfast watch`` (called in this process, so torch and
feedfast are imported once), their output captured at the file descriptors: a plain torch
loop whose own timing is the truth, two gloo ranks under torchrun, a Lightning fit, two
loaders at once (torch's with forked workers and feedfast's), jobs ended by os._exit, SIGTERM and
SIGKILL (their figures written as they went), a job with no DataLoader and
jobs that fail. The rest are the pure parts: the start-up hook's chaining, the advice, the
report, the hook's cost.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from feedfast.cli.main import main
from feedfast.cli.watch_advice import Machine, advise, shard_pattern
from feedfast.cli.watch_report import build, text
from feedfast.meter.loaderfacts import data_source
from tests.helpers import SMALL_SPEC, free_port

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "watch_jobs"
HOOK = ROOT / "feedfast" / "meter" / "startup"


def _line_of(script: Path, text_in_line: str) -> int:
    return next(n for n, line in enumerate(script.read_text().splitlines(), 1) if text_in_line in line)


def _watch(capfd: pytest.CaptureFixture[str], tmp_path: Path, job: list[str], *options: str) -> tuple[int, dict, str,
                                                                                                       str]:
    """Run ``feedfast watch --json`` on ``job``: (exit status, report, stdout, stderr)."""
    report = tmp_path / "watch.json"
    status = main(["watch", "--json", str(report), *options, "--", *job])
    out, err = capfd.readouterr()
    return status, json.loads(report.read_text()), out, err


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_loop_is_measured_within_two_points_of_its_own_timing(
        workers: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    truth_file, plot = tmp_path / "truth.json", tmp_path / "watch.png"
    job = [sys.executable, str(JOBS / "plain_loop.py"), "--workers", str(workers), "--truth", str(truth_file)]
    if workers:  # two forked workers, each making a batch in 24 ms: one every 12 ms against a 6 ms step
        job += ["--fetch-ms", "6", "--compute-ms", "6"]
    plotting = workers == 0 and importlib.util.find_spec("matplotlib") is not None
    status, report, out, err = _watch(capfd, tmp_path, job, "--every", "20", *(["--plot", str(plot)] * plotting))
    truth = json.loads(truth_file.read_text())
    assert status == 0 and out.startswith("job: 60 steps")  # the job's stdout is its own
    row = report["loaders"][0]
    assert row["site"].endswith(f"plain_loop.py:{_line_of(JOBS / 'plain_loop.py', 'loader = DataLoader(')}")
    assert (row["kind"], row["role"], row["facts"]["num_workers"]) == ("torch", "train", workers)
    assert row["job"]["steps"] == truth["steps"] == 49
    assert abs(row["job"]["stall_fraction"] - truth["stall_fraction"]) < 0.02, (row["job"], truth)
    assert row["ranks"][0]["basis"] == "host-wait" and "host wait" in err
    assert "what next for" in err and "effective compute" in err
    assert any(item["action"].startswith("more workers") for item in report["advice"])  # ranked or not: cores busy?
    assert "feedfast watch: rank 0" in err and "40 steps" in err  # --every 20
    if plotting:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
def test_on_cuda_the_wait_is_the_gpus_idle_time_from_events(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    truth_file = tmp_path / "truth.json"
    job = [sys.executable, str(JOBS / "plain_loop.py"), "--device", "cuda", "--truth", str(truth_file)]
    status, report, _, err = _watch(capfd, tmp_path, job)
    truth = json.loads(truth_file.read_text())
    row = report["loaders"][0]
    assert status == 0 and row["ranks"][0]["basis"] == "gpu-events" and "CUDA events" in err
    # the step is a host sleep after a tiny kernel, so the GPU is idle for the whole of each wait
    assert abs(row["job"]["stall_fraction"] - truth["stall_fraction"]) < 0.02, (row["job"], truth)
    assert row["ranks"][0]["gpu_util"] is not None or "unavailable" in row["ranks"][0]["gpu_status"]


@pytest.mark.slow
def test_two_torchrun_ranks_are_both_reported_and_the_slow_one_named(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                f"--master_port={free_port()}"]
    status, report, out, err = _watch(capfd, tmp_path, [*torchrun, str(JOBS / "ddp_loop.py"), "--slow-rank", "1"])
    assert status == 0 and "rank 0 of 2" in out and "rank 1 of 2" in out
    (row,) = report["loaders"]
    ranks = {r["rank"]: r for r in row["ranks"]}
    assert sorted(ranks) == [0, 1] and report["processes"] == 2
    assert row["straggler"]["rank"] == 1
    assert ranks[1]["stall_fraction"] > ranks[0]["stall_fraction"] + 0.2
    assert "straggler: rank 1" in err and "rank 1 (straggler)" in err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                    reason="Lightning is a dev dependency: pip install -e '.[dev]' (see the Makefile)")
def test_a_lightning_fit_is_measured_training_loader_first(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = JOBS / "lightning_fit.py"
    status, report, out, err = _watch(capfd, tmp_path, [sys.executable, str(script)])
    assert status == 0 and "lightning: fit done" in out
    train, val = report["loaders"]
    assert train["site"].endswith(f":{_line_of(script, 'Slow(4 * 45')}") and train["role"] == "train"
    assert val["site"].endswith(f":{_line_of(script, 'Slow(4 * 6')}") and val["role"] == "eval"
    assert train["job"]["steps"] >= 30 and train["job"]["verdict"] != "too few steps"


@pytest.mark.slow
def test_two_loaders_read_at_once_torchs_with_forked_workers_and_feedfasts(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], shards: list[str]) -> None:
    """torch's DataLoader over WebDataset shards (two forked workers) zipped with feedfast's over the same shards."""
    pytest.importorskip("PIL")
    spec, script, folder = tmp_path / "spec.yaml", JOBS / "shards_loop.py", Path(shards[0]).parent
    spec.write_text(yaml.safe_dump(SMALL_SPEC))
    pattern = str(folder / f"train-{{0000..{len(shards) - 1:04d}}}.tar")
    job = [sys.executable, str(script), "--loader", "both", "--shards", pattern, "--spec", str(spec), "--workers", "2",
           "--batch", "4", "--size", "32", "--steps", "45", "--step-ms", "2"]
    status, report, out, _ = _watch(capfd, tmp_path, job)
    assert status == 0 and out.startswith("both: 45 steps")
    rows = {row["kind"]: row for row in report["loaders"]}
    assert rows["torch"]["site"].endswith(f":{_line_of(script, 'return DataLoader(')}")
    assert rows["feedfast"]["site"].endswith(f":{_line_of(script, 'loaders.append(feedfast.DataLoader(')}")
    for row in rows.values():
        assert row["job"]["steps"] >= 30 and row["facts"]["data"]["count"] == len(shards), row
        assert row["facts"]["num_workers"] == 2
    assert rows["torch"]["facts"]["data"]["kind"] == "tar-shards"  # found inside WebDataset's pipeline
    glob, torch_row = str(folder / "train-*.tar"), rows["torch"]
    if torch_row["job"]["verdict"] != "not input-bound":  # decoding 64-96 px JPEGs may keep up with a 2 ms step
        (gpu,) = [i for i in torch_row["advice"] if i["action"].startswith("decode on the GPU")]
        assert f'feedfast.DataLoader("imagenet-train", shards="{glob}", batch_size=4)' in gpu["action"]
        assert gpu["command"].startswith(f"feedfast bench imagenet-train --shards '{glob}' --batch-size 4 --step-ms ")


def test_a_job_without_a_dataloader_gets_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    job = [sys.executable, "-c", "import json; print(json.dumps(3.0))"]  # torchrun's launcher is the torch case
    status, report, out, err = _watch(capfd, tmp_path, job)
    assert (status, out, report["loaders"]) == (0, "3.0\n", [])
    ours = [line for line in err.splitlines() if line.startswith("feedfast watch")]
    assert len(ours) == 1 and ours[0].endswith("no DataLoader was iterated, nothing to measure")


def test_a_failing_job_keeps_its_exit_status_and_its_figures(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    job = [sys.executable, str(JOBS / "plain_loop.py"), "--steps", "40", "--exit", "3"]
    status, report, out, err = _watch(capfd, tmp_path, job, "--steps", "20")
    assert status == 3 and out.startswith("job: 40 steps") and "exit status 3" in err
    assert report["exit_status"] == 3
    assert report["loaders"][0]["job"]["steps"] == 20 - 10  # --steps 20 batches measured, the first 10 warm-up


@pytest.mark.parametrize(("job", "status"), [
    ([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], 128 + 15),
    (["feedfast-watch-no-such-command"], 127),
])
def test_signals_and_missing_commands_give_the_shells_statuses(
        job: list[str], status: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert _watch(capfd, tmp_path, job)[0] == status


def test_usage_errors_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["watch"]) == 2
    (tmp_path / "proc-1.json").write_text("{}")
    assert main(["watch", "--run-dir", str(tmp_path), "--", "true"]) == 2
    assert "earlier run" in capfd.readouterr().err


def test_the_hook_leaves_sys_path_alone_and_runs_the_sitecustomize_it_shadows(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    probe = ("import os, sys, sitecustomize; print(os.environ.get('THEIRS_RAN'), sitecustomize.__file__, "
             "any('startup' in p for p in sys.path), type(sys.meta_path[0]).__name__, 'torch' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HOOK), str(theirs)]), FEEDFAST_WATCH_DIR=str(tmp_path))
    shown = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert shown.split() == ["1", str(theirs / "sitecustomize.py"), "False", "_Finder", "False"]


def test_a_loader_is_named_where_the_job_built_it_not_where_its_subclass_calls_super() -> None:
    boot = importlib.import_module("feedfast.meter.startup.sitecustomize")  # by its dotted name: it only defines

    class Base:
        def __init__(self) -> None:
            self.dataset = object()

    class Sub(Base):
        def __init__(self) -> None:
            super().__init__()

    boot._wrap_init(Base)
    built = Sub()
    assert built.__dict__[boot.SITE] == (__file__, sys._getframe().f_lineno - 1)


def test_the_hook_costs_a_few_microseconds_a_step() -> None:
    from feedfast.meter import SimulatedGpu
    from feedfast.meter.hookcost import hook_overhead

    host, events = hook_overhead(steps=5_000), hook_overhead(steps=5_000, events=SimulatedGpu())
    print(f"feedfast watch hook: {host:.1f} us a step (host wait), {events:.1f} us with (simulated) events")
    assert host < 30 and events < 60  # 3 to 6 and 5 to 20 on 2 shared cores: an order of magnitude spare


def _row(stall: float, *, workers: int = 0, data: dict | None = None, steps: int = 100) -> dict[str, Any]:
    """A loader row of 100 steps of 20 ms, ``stall`` of it waiting, batches of 32."""
    figures = {"rank": 0, "steps": steps, "samples": 32 * steps, "wall_s": 0.02 * steps, "stall_fraction": stall,
               "host_stall_fraction": stall, "samples_per_s": 32 / 0.02, "verdict": None, "min_steps": 30}
    from feedfast.meter.stats import verdict

    figures["verdict"] = verdict(stall, steps)
    return {"site": "train.py:9", "kind": "torch", "role": "train", "ranks": [figures], "job": dict(figures),
            "straggler": None, "facts": {"num_workers": workers, "pin_memory": False, "batch_size": 32, "data": data,
                                         "dataset_class": "train.Images"}}


def test_advice_not_input_bound_says_stop_here() -> None:
    (item,) = advise(_row(0.02), Machine(cores_per_rank=8, cpu_busy=20.0, cuda=True))
    assert item["rank"] == 1 and item["action"] == "none needed, stop here" and "keeps up" in item["why"]


def test_advice_idle_cores_more_workers_first() -> None:
    items = advise(_row(0.5, workers=2), Machine(cores_per_rank=8, cpu_busy=30.0, cuda=True))
    first = items[0]
    # the loader makes a batch every 20 ms with 2 workers; the step computes 10 ms: 4 workers, twice as fast
    assert first["action"] == "more workers (num_workers=4)" and first["predicted_speedup"] == pytest.approx(2.0)
    assert first["predicted_stall_fraction"] == pytest.approx(0.0)
    assert any(i["action"].startswith("pin_memory=True") for i in items)


def test_advice_busy_cores_decode_on_the_gpu_with_the_jobs_shards() -> None:
    data = {"kind": "tar-shards", "shards": ["/d/train-0000.tar", "/d/train-0001.tar"], "count": 64}
    items = advise(_row(0.5, workers=2, data=data), Machine(cores_per_rank=8, cpu_busy=97.0, cuda=True))
    first = items[0]
    assert first["rank"] == 1 and 'feedfast.DataLoader("imagenet-train", shards="/d/train-*.tar"' in first["action"]
    assert first["command"] == "feedfast bench imagenet-train --shards '/d/train-*.tar' --batch-size 32 --step-ms 10"
    assert any(i["rank"] is None and "cores are busy" in i["why"] for i in items)


def test_advice_image_folder_reads_it_in_place() -> None:
    data = {"kind": "image-folder", "path": "/data/imagenet/train"}
    items = advise(_row(0.5, workers=7, data=data), Machine(cores_per_rank=8, cpu_busy=50.0, cuda=True))
    assert 'shards="/data/imagenet/train/"' in items[0]["action"] and "shards make" not in items[0]["action"]
    assert items[0]["command"] == ("feedfast bench imagenet-train --shards '/data/imagenet/train/' --batch-size 32 "
                                   "--step-ms 10")


def test_shard_patterns_and_data_sources(tmp_path: Path) -> None:
    assert shard_pattern({"shards": ["/d/a.tar"], "count": 1}) == "/d/a.tar"
    folder = types.SimpleNamespace(root=str(tmp_path), samples=[("x.jpg", 0)])
    wrapped = types.SimpleNamespace(dataset=types.SimpleNamespace(pipeline=[types.SimpleNamespace(
        urls=["s/train-000.tar", "s/train-001.tar"])]))
    assert data_source(folder) == {"kind": "image-folder", "path": str(tmp_path)}
    assert data_source(wrapped) == {"kind": "tar-shards", "shards": ["s/train-000.tar", "s/train-001.tar"], "count": 2}
    assert data_source(types.SimpleNamespace(n=3)) is None


def test_report_puts_the_training_loader_first_and_says_too_few_steps() -> None:
    def entry(site: str, grad: bool, steps: int) -> dict[str, Any]:
        summary = {**_row(0.3, steps=steps)["ranks"][0], "basis": "host-wait", "warmup_steps": 10}
        return {"site": site, "kind": "torch", "grad_enabled": grad, "num_workers": 0, "summary": summary}

    record = {"pid": 1, "rank": 0, "host": "h", "cores": 4, "cuda": False, "usage": {}, "samplers": {},
              "loaders": [entry("val.py:3", False, 200), entry("train.py:9", True, 12)]}
    rep = build([record], command=["python", "train.py"], exit_status=0, wall_s=1.0)
    assert [r["site"] for r in rep["loaders"]] == ["train.py:9", "val.py:3"]
    assert rep["advice"][0]["action"] == "measure longer"
    assert "train.py:9 (torch, train)" in text(rep)


@pytest.mark.parametrize(("end", "status", "how"), [
    ("os_exit", 0, "by os._exit"),
    ("sigterm", 128 + 15, "by SIGTERM"),
    ("sigkill", 128 + 9, "without exiting (SIGKILL"),
])
def test_a_job_that_ends_abruptly_keeps_what_it_wrote_as_it_went(end: str, status: int, how: str, tmp_path: Path,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """os._exit, a SIGTERM from another process (the job dies of it, status kept), SIGKILL: the report has the steps
    written before the end (all 150 but the 12 left out, on os._exit and SIGTERM; on SIGKILL at least the write of
    its first 2 s) and
    names the process as ended abruptly."""
    steps = 150 if end != "sigkill" else 300  # 10 ms steps: a SIGKILL lands after at least one write as it goes
    job = [sys.executable, str(JOBS / "abrupt_loop.py"), "--end", end, "--steps", str(steps)]
    got, report, out, err = _watch(capfd, tmp_path, job)
    assert got == status and f"job: {steps} steps" in out
    measured = report["loaders"][0]["job"]["steps"]
    assert measured >= (steps - 12 if end != "sigkill" else 100), report  # the first batch, 10 of warm-up, the open step
    assert measured <= steps + 50
    (abrupt,) = report["abrupt"]
    assert abrupt["end"] == {"os_exit": "os._exit", "sigterm": "SIGTERM", "sigkill": "running"}[end]
    assert abrupt["steps"] == measured
    assert f"ended abruptly: rank 0 pid {abrupt['pid']} {how}" in err and "no DataLoader was iterated" not in err


def test_sigterm_is_handed_on_to_the_jobs_own_handler(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The job's handler runs (and ends the job through sys.exit, so its exit writes the figures: not abrupt)."""
    marker = tmp_path / "handler.txt"
    job = [sys.executable, str(JOBS / "abrupt_loop.py"), "--end", "sigterm", "--own-handler", str(marker)]
    got, report, _, err = _watch(capfd, tmp_path, job)
    assert got == 3 and marker.read_text() == "job's handler ran\n"
    assert report["abrupt"] == [] and report["loaders"][0]["job"]["steps"] >= 150 - 12
