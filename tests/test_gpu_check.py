"""benchmarks/gpu_check.py: the dry run end to end, and its wheel set-up and bookkeeping in-process."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SECTIONS = ["setup", "dataset", "readme_default", "dali_anchor", "decode_gpu", "train_synthetic", "train_default",
            "recipe_gpu", "pixels_hw", "folder_gpu", "train_feedfast_gpu", "train_feedfast_cpu",
            "train_threads", "train_torch", "train_tuned", "sync_debug", "loader_gpu", "loader_cpu_cuda", "placement",
            "loader_cpu_cpu", "stall", "nvml"]
NEEDS_CUDA = ("train_feedfast_gpu", "loader_gpu", "loader_cpu_cuda", "placement")


@pytest.fixture(scope="module")
def gc() -> ModuleType:
    """The script, imported as a module."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gcw(gc: ModuleType) -> ModuleType:
    """The script's wheel set-up module (importable once the script has put its folder on the path)."""
    return importlib.import_module("gpucheck_wheels")


def _wheel(folder: Path, name: str, files: dict[str, str]) -> Path:
    """A minimal valid wheel ``name-1.0-py3-none-any.whl`` holding ``files``."""
    info = f"{name}-1.0.dist-info"
    members = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
               f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    members[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in members.items():
            zf.writestr(path, text)
    return wheel


@pytest.mark.slow
def test_dry_run_prints_one_table_and_records_every_section(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, FEEDFAST_CACHE=str(tmp_path / "cache"), PYTHONPATH=path, PYTHONUNBUFFERED="1")
    env.pop("WHEELS", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--json", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["what", "samples/s", "stall", "GPU", "util", "%", "1st", "batch", "s", "figure", "note"]
    assert set(lines[1]) == {"-"} and sum(set(line) == {"-"} for line in lines) == 1  # one table
    assert f"{len(SECTIONS)} sections" in proc.stdout and "all ran" in proc.stdout

    report = json.loads(out.read_text())
    assert report["exit_code"] == 0 and report["environment"]["dry_run"] is True and report["complete"] is True
    assert report["limit_s"] == 360 and not out.with_name(out.name + ".part").exists()
    sections = report["sections"]
    assert list(sections) == SECTIONS
    for name, sec in sections.items():
        assert sec["status"] in ("ok", "skipped"), (name, sec["note"])
        if sec["status"] == "ok":
            assert any(row["figure"] is not None or row["samples_per_s"] is not None
                       or row["first_batch_s"] is not None for row in sec["rows"]), name
        else:
            assert sec["note"].startswith("skipped: "), name
    for name in NEEDS_CUDA:
        assert sections[name]["status"] == "skipped" and "dry run" in sections[name]["note"]
    readme = sections["readme_default"]["data"]  # run from another folder: the spec is found by its shipped name
    assert readme["device"] == "cpu" and readme["placement"] == "cpu" and readme["shape"][0] == 64
    assert sections["sync_debug"]["status"] == "skipped" and "host syncs unchecked" in sections["sync_debug"]["note"]
    epoch = sections["sync_debug"]["data"]["cpu_cpu"]
    assert epoch["verdict"] == "ran" and epoch["error"] is None and epoch["batches"] == epoch["expected"] > 0
    assert sections["loader_cpu_cpu"]["data"]["images_per_s"] > 0
    stall = sections["stall"]["data"]
    assert abs(stall["sleep_20ms"]["measured"] - 0.5) < 0.1 and stall["sleep_5ms"]["measured"] < 0.05
    assert sections["nvml"]["status"] == "skipped" and "NVML" in sections["nvml"]["note"]
    assert sections["train_tuned"]["data"]["tuning"]["tunable"] == ["threads", "prefetch"]
    trained = ["train_feedfast_cpu", "train_threads", "train_tuned"]
    if importlib.util.find_spec("torchvision") is None:  # make setup's small set: the torchvision row says why not
        assert sections["train_torch"]["status"] == "skipped" and "torchvision" in sections["train_torch"]["note"]
    else:
        trained.append("train_torch")
        assert "inside the measured wait" in sections["train_torch"]["rows"][0]["note"]
    for name in trained:
        data = sections[name]["data"]
        assert data["samples_per_s"] > 0 and data["stall_fraction"] is not None and data["verdict"]
        assert data["first_batch_s"] > 0 and data["model"] == "TinyNet (dry run)"
        assert data["steps"] == report["sizes"]["train_steps"] and "NVML" in sections[name]["rows"][0]["note"]
        (row,) = sections[name]["rows"]
        assert row["samples_per_s"] == data["samples_per_s"] and row["stall"] == data["stall_fraction"]
    # each row ran what its label says
    assert sections["train_feedfast_cpu"]["data"]["backend"] == "dali" and "DALI" in sections["train_feedfast_cpu"]["title"]
    for name in ("train_threads", "train_tuned"):
        assert sections[name]["data"]["backend"] == "threads" and "threads" in sections[name]["title"]
    decode = sections["decode_gpu"]["data"]
    assert decode["images_per_s"] > 0 and decode["target"] == 7950 and decode["backend"] == "dali"
    assert decode["share_of_target"] == pytest.approx(decode["images_per_s"] / 7950)
    anchor = sections["dali_anchor"]["data"]  # the hand-written DALI pipeline every GPU row is divided by
    assert anchor["images_per_s"] > 0 and decode["anchor_share"] == pytest.approx(decode["images_per_s"] /
                                                                                 anchor["images_per_s"])
    # issue 36's targets: judged beside their figures, reported but not enforced in a dry run
    assert decode["anchor_first_batch_late_s"] == pytest.approx(decode["first_batch_s"] - anchor["first_batch_s"])
    for timing in (anchor, decode):  # epoch after epoch: at least two boundaries, each against the batch period
        assert timing["epochs"] >= 3 and len(timing["boundaries_s"]) >= 2 and timing["period_s"] > 0
        assert timing["worst_boundary_periods"] == pytest.approx(max(timing["boundaries_s"]) / timing["period_s"])
    targets = decode["targets"]
    assert [(t["op"], t["bound"]) for t in targets.values()] == [(">=", 0.9), ("<=", 1.0), ("<=", 2.0)]
    assert all(t["verdict"] in ("pass", "FAIL") for t in targets.values())
    ceiling, fed = sections["train_synthetic"]["data"], sections["train_default"]["data"]
    assert ceiling["samples_per_s"] > 0 and ceiling["first_batch_s"] is None and fed["backend"] == "dali"
    assert fed["synthetic_share"] == pytest.approx(fed["samples_per_s"] / ceiling["samples_per_s"])
    assert fed["targets"]["rate / synthetic data's"]["bound"] == 0.95
    recipe = sections["recipe_gpu"]["data"]
    assert recipe["images_per_s"] > 0 and recipe["backend"] == "dali" and "targets" not in recipe
    assert recipe["anchor_share"] == pytest.approx(recipe["images_per_s"] / anchor["images_per_s"])
    folder = sections["folder_gpu"]["data"]  # issue 38: the folder read in place against DALI's readers.file
    assert folder["files"] == report["sizes"]["samples"] and folder["backend"] == "dali" and folder["placement"] == "cpu"
    assert folder["images_per_s"] > 0 and folder["dali_images_per_s"] > 0 and folder["first_batch_s"] > 0
    assert len(folder["rates"]) == len(folder["dali_rates"]) == folder["rounds"] == 3
    assert folder["share"] == pytest.approx(sorted(a / b for a, b in zip(folder["rates"], folder["dali_rates"]))[1])
    (target,) = folder["targets"].values()
    assert (target["op"], target["bound"]) == (">=", 0.9) and target["verdict"] in ("pass", "FAIL")
    assert folder.get("targets_enforced", True) is (target["verdict"] == "pass")  # reported, not enforced
    pixels = sections["pixels_hw"]["data"]
    assert pixels["bad_batches"] == [] and pixels["images"] > 0 and pixels["mean_levels"] == 0.0
    rows = report["table"]
    assert any(r["what"] == "loader GPU-placed -> cuda" and r["note"].startswith("skipped") for r in rows)


def test_the_folder_holds_the_shards_photos_by_class_and_is_written_once(gc: ModuleType, tmp_path: Path) -> None:
    from feedfast.write.demo import synth_dataset

    shards = synth_dataset(samples=12, per_shard=5, min_side=40, max_side=60, num_classes=3, cache_dir=tmp_path)
    gcf = importlib.import_module("gpucheck_folder")
    root = gcf.folder_of(shards)
    expected = {}
    for shard in shards:
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if m.name.endswith(".cls"):
                    key = m.name[: -len(".cls")]
                    label = int(tar.extractfile(m).read().decode())  # type: ignore[union-attr]
                    expected[f"class{label:04d}/{key}.jpg"] = tar.extractfile(key + ".jpg").read()  # type: ignore[union-attr]
    written = {str(p.relative_to(root)): p.read_bytes() for p in root.glob("*/*.jpg")}
    assert written == expected and len(written) == 12
    stamp = (root.parent / "COMPLETE").stat().st_mtime_ns
    assert gcf.folder_of(shards) == root and (root.parent / "COMPLETE").stat().st_mtime_ns == stamp
    assert not list(root.parent.parent.glob("*.part-*"))


def test_the_table_puts_feeds_in_columns_and_other_figures_beside_them(gc: ModuleType) -> None:
    feed = gc.Section("train", "(a) feed")
    feed.add_feed("", samples_per_s=2500.0, stall=0.012, gpu_util=97.0, first_batch_s=1.5, note="ResNet-50")
    other = gc.Section("stall", "stall meter")
    other.add("20 ms sleep", 0.5, "fraction", "expected 0.50")
    skipped = gc.Section("gpu", "(b) feed", status="skipped", note="skipped: no CUDA (dry run)")
    lines = gc.render(gc.table_rows([feed, other, skipped])).splitlines()
    assert lines[2].split() == ["(a)", "feed", "2,500", "0.012", "97.00", "1.50", "ResNet-50"]
    assert lines[3].split() == ["stall", "meter:", "20", "ms", "sleep", "0.500", "fraction", "expected", "0.50"]
    assert lines[4].split()[-5:] == ["skipped:", "no", "CUDA", "(dry", "run)"]
    assert lines[2].index("2,500") + len("2,500") == lines[0].index("samples/s") + len("samples/s")  # aligned
    assert lines[3].index("0.500") == lines[0].index("figure")


def test_a_failing_section_is_recorded_in_one_line_and_the_run_goes_on(gc: ModuleType,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    ctx = gc.make_context(gc.parse_args(["--dry-run"]))

    def boom(ctx: Any, sec: Any) -> None:
        sec.add("measured before the failure", 1.5, "s")
        raise ValueError("bad thing\nsecond line")

    sec = gc.run_step(gc.Step("boom", "boom", boom), ctx)
    assert sec.status == "error" and sec.note == "error: ValueError: bad thing"
    assert "Traceback" in sec.data["traceback"] and "Traceback" in capsys.readouterr().err
    rows = gc.table_rows([sec])
    assert [r.figure for r in rows] == [1.5, None] and rows[-1].note == sec.note
    ok = gc.run_step(gc.Step("next", "next", lambda c, s: s.add("figure", 2.0)), ctx)
    assert ok.status == "ok" and ok.rows[0].figure == 2.0


def test_a_spent_budget_skips_every_section_and_exits_1(gc: ModuleType, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert gc.main(["--dry-run", "--budget", "1e-9", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["exit_code"] == 1 and list(report["sections"]) == SECTIONS
    for name, sec in report["sections"].items():
        if name in NEEDS_CUDA:  # a dry run skips these before looking at the clock
            assert sec["status"] == "skipped" and "dry run" in sec["note"]
        else:
            assert sec["status"] == "over-budget" and sec["note"].startswith("skipped: time budget"), name
    assert "problems in: setup" in capsys.readouterr().out


def test_the_json_is_rewritten_after_every_section(gc: ModuleType, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.json"
    seen: list[list[str]] = []

    def look(ctx: Any, sec: Any) -> None:
        seen.append(list(json.loads(out.read_text())["sections"]) if out.exists() else [])

    steps = tuple(gc.Step(name, name, look) for name in ("one", "two", "three"))
    monkeypatch.setattr(gc, "STEPS", steps)
    assert gc.main(["--dry-run", "--json", str(out)]) == 0
    assert seen == [[], ["one"], ["one", "two"]]
    report = json.loads(out.read_text())
    assert report["complete"] is True and list(report["sections"]) == ["one", "two", "three"]


def test_a_section_past_its_limit_prints_every_threads_traceback_and_fails(
        gc: ModuleType, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    import time
    from dataclasses import replace

    guard = importlib.import_module("gpucheck_guard")
    ctx = gc.make_context(gc.parse_args(["--dry-run"]))
    ctx.sizes = replace(ctx.sizes, section_limit=0.3)
    watchdog = guard.Watchdog(60.0, lambda: None, poll_s=0.05)
    try:
        sec = gc.run_step(gc.Step("slow", "slow", lambda c, s: time.sleep(0.8)), ctx, watchdog)
        fast = gc.run_step(gc.Step("fast", "fast", lambda c, s: None), ctx, watchdog)
    finally:
        watchdog.stop()
    assert sec.status == "error" and "past its limit of 0.3 s" in sec.note and fast.status == "ok"
    err = capfd.readouterr().err
    assert "section 'slow' is past its limit" in err and "test_gpu_check.py" in err  # the sleeping frame


def test_the_outer_limit_ends_a_hung_run_with_the_json_written(tmp_path: Path) -> None:
    """A section that never returns: the run ends at --limit with exit 3, tracebacks, and the JSON so far."""
    out = tmp_path / "out.json"
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import gpu_check as gc\n"
            "gc.STEPS = (gc.Step('quick', 'quick', lambda c, s: s.add('x', 1.0)),\n"
            "            gc.Step('hang', 'hang', lambda c, s: time.sleep(600)))\n"
            f"sys.exit(gc.main(['--dry-run', '--limit', '3', '--json', {str(out)!r}]))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), os.environ.get("PYTHONPATH", ""))))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "past its outer limit of 3 s" in proc.stderr and "time.sleep(600)" not in proc.stdout
    assert "in <lambda>" in proc.stderr  # the hung frame, from faulthandler
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["exit_code"] == 3 and list(report["sections"]) == ["quick"]


class _SlowBoundaries:
    """A loader of 4 batches an epoch, one every 4 ms, whose epochs after the first start 40 ms late."""

    def __init__(self) -> None:
        self.epochs = 0

    def __iter__(self) -> Any:
        import time

        if self.epochs:
            time.sleep(0.040)
        self.epochs += 1
        for _ in range(4):
            time.sleep(0.004)
            yield torch.zeros(2, 1), torch.zeros(2)


def test_epoch_boundaries_are_timed_against_the_batch_period_and_judged(gc: ModuleType) -> None:
    from gpucheck_common import DRY_SIZES, Budget, CheckFailed, Context, Section, enforce
    from gpucheck_timing import timed_epochs

    ctx = Context(sizes=DRY_SIZES, dry=True, cuda=False, cuda_present=False, budget=Budget(60), wheels=None,
                  target=None)
    timing = timed_epochs(_SlowBoundaries(), ctx, 0.0, count=3, min_boundaries=2)
    assert timing.epochs == 3 and timing.batches == 9 and len(timing.boundaries_s) == 2
    assert 0.003 < timing.period_s < 0.010 and all(b > 0.040 for b in timing.boundaries_s)
    assert timing.worst_boundary_periods > 4 and timing.images_per_s > 0
    ctx.results.update(anchor_images_per_s=timing.images_per_s, anchor_first_batch_s=timing.first_s)
    sec = Section("decode_gpu", "t")
    importlib.import_module("gpucheck_anchor").anchor_share(ctx, sec, timing)
    verdicts = {what: t["verdict"] for what, t in sec.data["targets"].items()}
    assert list(verdicts.values()) == ["pass", "pass", "FAIL"]  # the same rate and first batch; a slow boundary
    enforce(ctx, sec)  # a dry run reports a missed target
    assert sec.rows[-1].what == "targets missed" and sec.data["targets_enforced"] is False
    with pytest.raises(CheckFailed, match="epoch boundary"):
        enforce(dataclasses.replace(ctx, cuda=True), sec)  # on a GPU it fails the section


def test_a_wrong_pixel_fails_the_hardware_decode_check(gc: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    decode = importlib.import_module("gpucheck_decode")
    check_failed = importlib.import_module("gpucheck_common").CheckFailed
    ctx = gc.make_context(gc.parse_args(["--dry-run"]))
    good = torch.zeros(4, 3, 8, 8)
    corrupt = good.clone()
    corrupt[2, :, :4] = 2.0  # half of one image garbled, as a decoder race leaves it
    keys = ["a", "b", "c", "d"]

    class Ran:
        class plan:  # noqa: N801 - stands in for loader.plan
            placement = "cpu"

    runs = {"cpu": iter([([(good, keys), (corrupt, keys)], 100.0, Ran), ([(good, keys), (good, keys)], 50.0, Ran)])}
    monkeypatch.setattr(decode, "pixel_batches", lambda c, placement, device, count: next(runs["cpu"]))
    sec = gc.Section("pixels_hw", "pixels")
    with pytest.raises(check_failed, match="differ from DALI's CPU decode in batches \\[1\\]"):
        decode.pixels_hw_section(ctx, sec)
    assert sec.data["bad_batches"] == [1] and sec.data["far_share"] == pytest.approx(0.5)
    one_level = good.clone() + 1 / decode.STD_LEVELS  # every value one level off: IDCT noise, passes
    assert decode.image_differences(one_level, good)["mean_levels"] == pytest.approx(1.0)


def test_nvml_samples_only_the_measured_steps_and_the_torch_copy_is_inside_the_wait(
        gc: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import feedfast.meter

    train = importlib.import_module("gpucheck_train")
    ctx = gc.make_context(gc.parse_args(["--dry-run"]))
    handed: list[int] = []
    started_at: list[int] = []

    class Sampler:
        def __init__(self, **kw: Any) -> None:
            return None

        def start(self) -> None:
            started_at.append(len(handed))

        def stop(self) -> None:
            return None

        def status(self) -> str:
            return "fake"

        def figures(self) -> dict[str, Any]:
            return {"gpu_util": 50.0}

    def batches() -> Any:
        while True:
            handed.append(1)
            yield torch.zeros(2, 3, 8, 8), torch.zeros(2, dtype=torch.int64)

    monkeypatch.setattr(feedfast.meter, "NvmlSampler", Sampler)
    run = train.train(ctx, train.prepare(ctx), batches(), 0.0)
    assert started_at == [ctx.sizes.train_warmup + 1] and run.nvml["gpu_util"] == 50.0  # after the warm-up steps
    fed: list[str] = []
    monkeypatch.setattr(train, "train", lambda c, t, b, s: fed.append(b.__name__) or run)
    monkeypatch.setattr(train, "report_training", lambda *a: None)
    ctx.shards, ctx.shard_paths = "x", ["x.tar"]
    class TorchLoader(list):  # what make_torch_loader returns, with no batches
        timeout = 0.0

    monkeypatch.setattr("feedfast.baseline.torch_recipe.make_torch_loader", lambda *a, **k: TorchLoader())
    monkeypatch.setattr("feedfast.baseline.vision.transforms", lambda: None)  # the loader above needs no torchvision
    train.train_torch_section(ctx, gc.Section("train_torch", "t"))
    assert fed == ["on_device"]  # the copy happens in next(), before the meter's ready event


def test_wheel_pieces_are_joined_installed_once_and_put_on_the_path(gcw: ModuleType, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    build, folder, target = tmp_path / "build", tmp_path / "wheels", tmp_path / "site"
    build.mkdir()
    folder.mkdir()
    wheel = _wheel(build, "ffgc_probe", {"ffgc_probe/__init__.py": "VALUE = 42\n"})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(wheel, arcname=f"w/{wheel.name}")
    data = buf.getvalue()
    third = len(data) // 3 + 1
    for i, suffix in enumerate(("aa", "ab", "ac")):
        (folder / f"wheels.tar.part-{suffix}").write_bytes(data[i * third:(i + 1) * third])

    done = gcw.join_pieces(folder)
    assert done[0].startswith("joined 3 pieces into wheels.tar") and done[1] == "unpacked 1 wheels from wheels.tar"
    wheels = sorted(folder.glob("*.whl"))
    assert [w.name for w in wheels] == [wheel.name]
    assert "pip install --no-index --no-deps --target" in gcw.install_wheels(wheels, target, timeout=120)
    assert gcw.install_wheels(wheels, target, timeout=120).startswith("already installed")

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    gcw.activate(target)
    try:
        assert importlib.import_module("ffgc_probe").VALUE == 42
    finally:
        sys.modules.pop("ffgc_probe", None)
    assert os.environ["PYTHONPATH"] == str(target)


def test_unzip_fallback_installs_package_and_data_purelib_files(gcw: ModuleType, tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "ffgc_unzip", {"ffgc_unzip/__init__.py": "A = 1\n",
                                            "ffgc_unzip-1.0.data/purelib/ffgc_extra.py": "B = 2\n",
                                            "ffgc_unzip-1.0.data/scripts/tool": "#!/bin/sh\n"})
    gcw.unzip_wheel(wheel, tmp_path / "site")
    assert (tmp_path / "site" / "ffgc_unzip" / "__init__.py").read_text() == "A = 1\n"
    assert (tmp_path / "site" / "ffgc_extra.py").read_text() == "B = 2\n"
    assert not (tmp_path / "site" / "tool").exists()


def test_activate_reaches_an_nvidia_folder_hidden_by_a_regular_nvidia_package(
        gcw: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvidia = pytest.importorskip("nvidia")
    if not isinstance(getattr(nvidia, "__path__", None), list):
        pytest.skip("nvidia is a namespace package here; nothing hides the target's folder")
    (tmp_path / "nvidia" / "ffgc_part").mkdir(parents=True)
    (tmp_path / "nvidia" / "ffgc_part" / "__init__.py").write_text("OK = True\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(nvidia, "__path__", list(nvidia.__path__))
    monkeypatch.setenv("PYTHONPATH", "")
    gcw.activate(tmp_path)
    try:
        assert importlib.import_module("nvidia.ffgc_part").OK is True
    finally:
        sys.modules.pop("nvidia.ffgc_part", None)


def test_pieces_made_for_the_gpu_machine_are_under_58_mb_and_join_back(gcw: ModuleType, tmp_path: Path) -> None:
    assert gcw.PIECE_BYTES < 58_000_000 and "nvidia-dali-cuda130" in gcw.PACKAGES
    made, pieces_dir = tmp_path / "made", tmp_path / "pieces"
    made.mkdir()
    wheels = [_wheel(made, name, {f"{name}/__init__.py": "X = 1\n" * 400}) for name in ("ffgc_a", "ffgc_b")]
    pieces = gcw.pack(wheels, pieces_dir, piece_bytes=1000)
    assert len(pieces) > 2 and all(p.stat().st_size <= 1000 for p in pieces)
    assert [p.name for p in pieces][:2] == ["wheels.tar.part-aa", "wheels.tar.part-ab"]
    assert not (pieces_dir / "wheels.tar").exists()
    gcw.join_pieces(pieces_dir)
    assert sorted(w.name for w in pieces_dir.glob("*.whl")) == sorted(w.name for w in wheels)
    assert all((pieces_dir / w.name).read_bytes() == w.read_bytes() for w in wheels)


def _fake_site(tmp_path: Path, gcw: ModuleType) -> tuple[Path, Path, Path]:
    """A site with a module, incompressible data and ``feedfast-ext/`` built from a fake checkout's C source."""
    site, repo = tmp_path / "site", tmp_path / "repo"
    (repo / "feedfast").mkdir(parents=True)
    (repo / "feedfast" / "_fake.c").write_text("int fake;\n")
    (site / "ffgc_site_probe").mkdir(parents=True)
    (site / "ffgc_site_probe" / "__init__.py").write_text("VALUE = 7\n")
    (site / "ffgc_site_probe" / "blob.bin").write_bytes(os.urandom(40_000))  # several pieces of 8,000 bytes
    ext = site / gcw.EXT_DIR
    ext.mkdir()
    (ext / "_fake.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF fake extension")
    (ext / "libjpeg.so.62").write_bytes(b"\x7fELF fake libjpeg")
    (ext / "SOURCES").write_text(gcw.source_hashes(repo))
    return site, repo, tmp_path / "pieces"


@pytest.mark.parametrize("use_xz", [False, None], ids=["python-lzma", "xz-command-if-present"])
def test_a_packed_site_arrives_from_its_pieces_and_a_missing_or_short_piece_is_named(
        gcw: ModuleType, tmp_path: Path, use_xz: bool | None) -> None:
    site, repo, out = _fake_site(tmp_path, gcw)
    name = f"site-py{sys.version_info[0]}{sys.version_info[1]}.tar.xz"
    pieces = gcw.pack_site(site, out, name=name, piece_bytes=8000, preset="0", use_xz=use_xz)
    total = len(pieces)
    assert total > 3 and all(p.stat().st_size <= 8000 for p in pieces)
    assert [p.name for p in pieces] == [f"{name}.part-{i}-of-{total}" for i in range(1, total + 1)]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in pieces)  # nothing else to copy
    assert gcw.find_site(out) == (name, pieces)

    # feedfast-ext/ comes first, so it alone is read without the rest
    assert gcw.unpack_site(pieces, tmp_path / "ext-only", only=gcw.EXT_DIR) == 3
    assert sorted(p.name for p in (tmp_path / "ext-only").iterdir()) == [gcw.EXT_DIR]

    target = tmp_path / "target"
    assert gcw.install_site(name, pieces, target).startswith(f"unpacked 5 files ({name}, {total} pieces)")
    for path in site.rglob("*"):
        if path.is_file():
            assert (target / path.relative_to(site)).read_bytes() == path.read_bytes()
    assert gcw.install_site(name, pieces, target).endswith("already unpacked in " + str(target))

    # the extensions go into the checkout's feedfast/ when its C sources are the ones they were built from
    package = repo / "feedfast"
    assert gcw.install_extensions(target / gcw.EXT_DIR, package).startswith("copied _fake.cpython-312")
    assert (package / "libjpeg.so.62").read_bytes() == b"\x7fELF fake libjpeg" and not (package / "SOURCES").exists()
    assert gcw.install_extensions(target / gcw.EXT_DIR, package).startswith("feedfast's C extensions already in")
    (package / "_fake.c").write_text("int changed;\n")
    with pytest.raises(RuntimeError, match=r"other C sources than this checkout's \(feedfast/_fake.c\)"):
        gcw.install_extensions(target / gcw.EXT_DIR, package)

    second = pieces[1]
    second.rename(tmp_path / second.name)
    with pytest.raises(RuntimeError, match=rf"missing {re.escape(second.name)} \({total - 1} of {total} pieces"):
        gcw.find_site(out)
    (tmp_path / second.name).rename(second)
    full = pieces[0].stat().st_size  # cut evenly: every piece but the last has this size
    assert {p.stat().st_size for p in pieces[:-1]} == {full} and pieces[-1].stat().st_size <= full
    pieces[0].write_bytes(pieces[0].read_bytes()[:5000])
    with pytest.raises(RuntimeError, match=rf"{re.escape(pieces[0].name)}: 5000 bytes where the largest piece has {full}"):
        gcw.pieces_of(out, name)
    pieces[0].unlink()  # without the first, the second is taken for the first: the count still finds it
    with pytest.raises(RuntimeError, match=rf"missing {re.escape(pieces[0].name)} "):
        gcw.pieces_of(out, name)


def test_lettered_pieces_with_a_gap_name_the_missing_one(gcw: ModuleType, tmp_path: Path) -> None:
    for suffix in ("aa", "ac"):
        (tmp_path / f"wheels.tar.part-{suffix}").write_bytes(b"x" * 10)
    with pytest.raises(RuntimeError, match=r"missing wheels.tar.part-ab "):
        gcw.join_pieces(tmp_path)


def test_setup_installs_a_packed_site_and_copies_the_extensions_into_the_checkout(
        gc: ModuleType, gcw: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site, repo, out = _fake_site(tmp_path, gcw)
    name = f"site-py{sys.version_info[0]}{sys.version_info[1]}.tar.xz"
    pieces = gcw.pack_site(site, out, name=name, piece_bytes=8000, preset="0")
    monkeypatch.setattr(gcw, "REPO", repo)  # the fake checkout's feedfast/ gets the extensions
    monkeypatch.setattr(gcw, "REQUIRED", ("ffgc_site_probe",))
    monkeypatch.setattr(gcw, "EXTENSIONS", ())
    path = list(sys.path)
    monkeypatch.setattr(sys, "path", list(path))
    monkeypatch.setenv("PYTHONPATH", "")
    ctx = gc.make_context(gc.parse_args(["--dry-run", "--wheels", str(out), "--target", str(tmp_path / "t")]))
    sec = gc.Section("setup", "setup")
    try:
        gcw.setup_section(ctx, sec)
        assert importlib.import_module("ffgc_site_probe").VALUE == 7
    finally:
        sys.modules.pop("ffgc_site_probe", None)
    notes = {row.what: row.note for row in sec.rows}
    assert notes["wheels"].startswith(f"unpacked 5 files ({name}, {len(pieces)} pieces) into {tmp_path / 't'}")
    assert notes["C extensions"].startswith("copied _fake.cpython-312-x86_64-linux-gnu.so, libjpeg.so.62 into")
    assert notes["import ffgc_site_probe"].startswith("from the wheels")
    assert (repo / "feedfast" / "_fake.cpython-312-x86_64-linux-gnu.so").exists()
    assert os.environ["PYTHONPATH"] == str(tmp_path / "t")

    pieces[-1].unlink()  # a fresh target: the last piece is missing, and named
    monkeypatch.setattr(sys, "path", list(path))
    ctx = gc.make_context(gc.parse_args(["--dry-run", "--wheels", str(out), "--target", str(tmp_path / "t2")]))
    with pytest.raises(RuntimeError, match=rf"missing {re.escape(pieces[-1].name)} "):
        gcw.setup_section(ctx, gc.Section("setup", "setup"))


def test_host_syncs_are_only_forbidden_with_cuda(gc: ModuleType) -> None:
    smoke = importlib.import_module("gpucheck_smoke")
    with smoke.host_syncs_forbidden(False):
        assert torch.zeros(2).sum().item() == 0.0  # no CUDA: a no-op
    if torch.cuda.is_available():
        with pytest.raises(RuntimeError), smoke.host_syncs_forbidden(True):
            torch.ones(2, device="cuda").sum().item()
        assert torch.cuda.get_sync_debug_mode() == 0


def test_sync_debug_fails_on_a_host_sync_or_a_short_epoch_and_names_the_path(
        gc: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    smoke = importlib.import_module("gpucheck_smoke")
    ctx = gc.make_context(gc.parse_args(["--dry-run"]))
    ctx.cuda = True  # the verdicts as on a GPU machine; the epochs themselves are stand-ins
    check_failed = importlib.import_module("gpucheck_common").CheckFailed
    results = {"cpu": (4, 4, "RuntimeError: called a synchronizing CUDA operation"), "gpu": (4, 4, None)}
    monkeypatch.setattr(smoke, "epoch_without_syncs", lambda c, placement, device: results[placement])
    sec = gc.Section("sync_debug", "sync-debug epoch")
    with pytest.raises(check_failed, match="cpu-placed -> cuda: RuntimeError: called a synchronizing"):
        smoke.sync_debug_section(ctx, sec)
    assert [(r.what, r.figure) for r in sec.rows] == [("cpu-placed -> cuda, one epoch", "FAIL"),
                                                     ("gpu-placed -> cuda, one epoch", "pass")]
    results["cpu"] = (3, 4, None)
    with pytest.raises(check_failed, match="3 of 4 batches: the epoch ended early"):
        smoke.sync_debug_section(ctx, gc.Section("sync_debug", "sync-debug epoch"))
