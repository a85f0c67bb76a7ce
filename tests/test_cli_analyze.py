"""``feedfast analyze``: the three runs on real shards, the model, the ranking and the page-cache tools."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from feedfast.cli.advice import (
    ReadWindow,
    Timings,
    decode_share,
    speedup_from_decode,
    step_recommendation,
    threads_needed,
)
from feedfast.cli.main import main
from feedfast.cli.pagecache import drop_cached, resident_fraction, stage_in_memory
from feedfast.cli.recommend import Context, crop_area, pixel_ratio, recommend, target_short_side

SMALL = ["--set", "pipeline.image[1].size=32", "--batch-size", "4", "--threads", "1", "--warmup", "1", "--quiet"]
RUN_KEYS = {"samples_per_s", "batch_ms", "wait_ms_per_batch", "stall_fraction", "time_to_first_batch_s", "batches"}
REC_KEYS = {"action", "applicable", "here", "predicted_speedup", "predicted_stall_fraction",
            "predicted_samples_per_s", "why", "rank"}


def _analyze(shards: list[str], tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "a.json"
    code = main(["analyze", "imagenet-train", "--shards", ",".join(shards), "--batches", "3", *SMALL,
                 "--json", str(out), *extra])
    assert code == 0
    return json.loads(out.read_text())


def test_analyze_with_step_reports_runs_stalls_and_ranked_fixes(shards: list[str], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rep = _analyze(shards, tmp_path, "--step-ms", "5")
    assert rep["mode"] == "step" and rep["step_ms"] == 5 and rep["batch_size"] == 4 and rep["threads"] == 1
    for name in ("synthetic", "cached", "cold"):
        run = rep["runs"][name]
        assert RUN_KEYS <= set(run), name
        assert run["batches"] == 3 and run["samples_per_s"] > 0 and 0 <= run["stall_fraction"] <= 1
    assert rep["runs"]["synthetic"]["batch_ms"] >= 5.0  # the simulated step is the ceiling
    assert rep["runs"]["synthetic"]["shapes"] == {"image": [4, 3, 32, 32], "label": [4]}
    staged = rep["runs"]["cached"]["where"].split()[2]  # "copied to FOLDER ..."
    assert "feedfast-analyze-" in staged and not Path(staged).exists()  # removed after the run
    pc = rep["runs"]["cold"]["page_cache"]
    assert set(pc) == {"method", "resident_before", "resident_after", "cold"}
    assert rep["runs"]["cold"]["fetch_is_lower_bound"] is (not pc["cold"])
    st = rep["stalls"]
    assert st["prep_stall_ms"] >= 0 and st["fetch_stall_ms"] >= 0 and st["verdict"]
    assert st["prep_stall_fraction"] + st["fetch_stall_fraction"] <= 1.0 + 1e-9
    assert st["fetch_basis"].startswith("start-up")  # 23 samples: the shuffle buffer holds them all
    assert rep["dataset"]["shards"] == 5 and rep["dataset"]["images_sampled"] == 23
    assert 64 <= rep["dataset"]["mean_short_side"] <= 96
    assert rep["decode"]["pil_ms_per_image"] > 0
    recs = rep["recommendations"]
    assert all(REC_KEYS <= set(r) for r in recs) and len(recs) == 6
    ranks = [r["rank"] for r in recs if r["rank"] is not None]
    assert ranks == list(range(1, len(ranks) + 1))
    gains = [r["predicted_speedup"] for r in recs if r["rank"] is not None]
    assert gains == sorted(gains, reverse=True)
    roi = next(r for r in recs if r["action"].startswith("region-of-interest"))
    assert roi["rank"] is None and "already fused" in roi["why"]
    assert "max(step, fetch + prep)" in rep["model"]
    assert "recommendations (ranked" in capsys.readouterr().out


def test_analyze_without_step_gives_throughput_ratios(shards: list[str], tmp_path: Path) -> None:
    rep = _analyze(shards[:2], tmp_path)
    assert rep["mode"] == "throughput" and rep["step_ms"] is None
    assert rep["stalls"]["prep_throughput_ratio"] > 0 and rep["stalls"]["fetch_throughput_ratio"] > 0
    assert any("no --step-ms" in n for n in rep["stalls"]["notes"])


@pytest.mark.parametrize("argv,needle", [
    (["analyze", "imagenet-train", "--shards", "x.tar", "--step-ms", "-1"], "--step-ms must be > 0, got -1"),
    (["analyze", "no-such-spec"], "spec not found: 'no-such-spec'"),
    (["analyze", "imagenet-train", "--shards", "/tmp/feedfast-none-*.tar"], "no shard matches"),
    (["analyze", "imagenet-train", "--shards", "x.tar", "--batches", "0"], "--batches must be > 0"),
])
def test_analyze_user_mistakes_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_threads_needed_and_step_recommendation() -> None:
    assert threads_needed(2, 600.0, 300.0) == 4
    assert threads_needed(4, 100.0, 300.0) == 4  # never fewer than now
    kw: dict[str, Any] = {"threads": 2, "required": 600.0, "placement": "cpu", "cuda": False}
    text, need = step_recommendation(stall_fraction=0.01, cores=8, achieved=700.0, **kw)
    assert text.startswith("none needed") and need is None
    text, need = step_recommendation(stall_fraction=0.5, cores=8, achieved=300.0, **kw)
    assert text.startswith("raise --threads to 4") and need == 4
    text, need = step_recommendation(stall_fraction=0.5, cores=2, achieved=200.0, **kw)
    assert "GPU decode" in text and "fewer/smaller images" in text and need == 6
    text, _ = step_recommendation(stall_fraction=0.5, cores=2, achieved=200.0, **{**kw, "cuda": True})
    assert text.startswith("GPU decode (--device gpu)")


def test_timings_model() -> None:
    t = Timings(step=0.100, cached=0.150, cold=0.200)
    assert t.prep == 0.150 and t.fetch == pytest.approx(0.050)
    s = t.stalls()
    assert s["prep_stall_ms"] == pytest.approx(50.0) and s["fetch_stall_ms"] == pytest.approx(50.0)
    assert s["prep_stall_fraction"] == pytest.approx(0.25) and s["fetch_stall_fraction"] == pytest.approx(0.25)
    assert t.predict() == (pytest.approx(0.200), pytest.approx(0.5))
    assert t.speedup(fetch_scale=0.0) == pytest.approx(0.200 / 0.150)
    assert t.speedup(prep_speedup=100.0, fetch_scale=0.0) == pytest.approx(2.0)  # capped by the step
    assert Timings(step=0.1, cached=0.3, cold=0.2).fetch == 0.0  # noise never gives a negative fetch
    assert decode_share(10.0, 64, 4, 0.4) == pytest.approx(0.4) and decode_share(10.0, 64, 1, 0.1) == 0.95
    assert speedup_from_decode(0.5, 0.0) == pytest.approx(2.0) and speedup_from_decode(0.5, 1.0) == 1.0


def test_read_window_picks_the_fetch_basis() -> None:
    big = ReadWindow(epoch_batches=20_000, batch_size=64, shuffle_buffer=1024, warmup=3, batches=10)
    assert big.timed_reads() == 640
    assert big.fetch(steady_s=0.02, startup_s=1.0) == (0.02, "steady state: cold minus cached batch time")
    assert big.fetch(steady_s=-0.01, startup_s=1.0)[0] == 0.0  # noise never gives a negative fetch
    demo = ReadWindow(epoch_batches=16, batch_size=64, shuffle_buffer=1024, warmup=3, batches=10)
    assert demo.timed_reads() == 0
    fetch, basis = demo.fetch(steady_s=0.04, startup_s=0.32)
    assert fetch == pytest.approx(0.02) and basis.startswith("start-up")
    part = ReadWindow(epoch_batches=20, batch_size=64, shuffle_buffer=0, warmup=3, batches=20)
    assert part.timed_reads() == 17 * 64 and part.fetch(steady_s=0.01, startup_s=0.0)[1].startswith("partial")


def _ctx(**changes: object) -> Context:
    base = {"batch_size": 64, "threads": 2, "cores": 8, "placement": "cpu", "cuda": False, "passes": (),
            "crop_area": 0.54, "target_short": 256, "decode_share": 0.6, "sizes": ((500, 375), (640, 480)),
            "mean_shard_mb": 10.0, "total_mb": 80.0, "ram_free_mb": 16000.0, "cold": True}
    return Context(**{**base, **changes})  # type: ignore[arg-type]


def test_recommend_ranks_by_predicted_gain_and_explains_the_rest() -> None:
    recs = recommend(Timings(step=0.05, cached=0.4, cold=0.5), _ctx())
    ranked = [r for r in recs if r["rank"]]
    assert ranked[0]["action"].startswith("more threads (--threads 8)")
    assert ranked[0]["predicted_speedup"] == pytest.approx(0.5 / (0.1 + 0.1))
    assert [r["predicted_speedup"] for r in ranked] == sorted((r["predicted_speedup"] for r in ranked), reverse=True)
    gpu = next(r for r in recs if r["action"].startswith("GPU decode"))
    assert gpu["here"] is False and "none on this machine" in gpu["action"]
    fused = recommend(Timings(0.05, 0.4, 0.4), _ctx(threads=8, passes=("fuse:decode+random_resized_crop@p",)))
    by = {r["action"].split(" (")[0]: r for r in fused}
    assert by["region-of-interest decode"]["rank"] is None and "already fused" in by["region-of-interest decode"]["why"]
    assert by["more threads"]["rank"] is None and "cores already in use" in by["more threads"]["why"]
    assert "no predicted gain" in by["cache shards in memory or on local NVMe"]["why"]
    idle = recommend(Timings(0.2, 0.1, 0.1), _ctx())
    assert all(r["rank"] is None for r in idle)  # the loader keeps up: nothing to gain


def test_spec_derived_figures() -> None:
    assert crop_area([0.08, 1.0]) == pytest.approx(0.54)
    assert target_short_side({"random_resized_crop": {"size": 224}}) == 256
    assert target_short_side({"resize": {"size": [256, 300]}, "center_crop": {"size": 224}}) == 256
    assert target_short_side({"decode": {}}) is None
    assert pixel_ratio(((512, 1024), (100, 100)), 256) == pytest.approx((0.25 + 1.0) / 2)


def test_page_cache_tools(tmp_path: Path) -> None:
    shard, index = tmp_path / "s.tar", tmp_path / "s.idx"
    shard.write_bytes(os.urandom(1 << 20))
    index.write_text("v1.2 0\n")
    frac = resident_fraction(str(shard))
    assert frac is None or 0.0 <= frac <= 1.0
    info = drop_cached([str(shard)])
    assert info["method"].startswith("fdatasync") and isinstance(info["cold"], bool)
    staged = stage_in_memory([str(shard)], [str(index)])
    try:
        assert Path(staged.paths[0]).read_bytes() == shard.read_bytes()
        assert Path(staged.paths[0]).with_suffix(".idx").read_text() == "v1.2 0\n"
        assert staged.how and (staged.resident is None or staged.resident > 0.5)
    finally:
        staged.cleanup()
    assert not staged.folder.exists()


def test_analyze_counts_delivered_samples_not_padding(shards: list[str], tmp_path: Path) -> None:
    rep = _analyze(shards, tmp_path, "--set", "batch.last_batch=pad", "--batches", "5")
    cold = rep["runs"]["cold"]  # 23 samples in batches of 4: batch 1 warms up, 2 to 6 are timed, 6 holds 3 + 1 pad
    assert cold["batches"] == 5 and cold["samples"] == 4 * 4 + 3
    assert cold["samples_per_s"] == pytest.approx(cold["samples"] / cold["wall_s"])
    assert rep["runs"]["synthetic"]["samples"] == 5 * 4  # pre-made batches have no padding
