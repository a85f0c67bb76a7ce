"""``feedfast analyze``'s ranking: by the gains the run's own figures support."""

from __future__ import annotations

import pytest

from feedfast.cli.advice import ReadWindow, Timings
from feedfast.cli.recommend import Context, plan_decode_share, recommend

FUSED = ("placement:cpu", "fuse:decode+random_resized_crop@pipeline.image[1]")


def _ctx(**changes: object) -> Context:
    """imagenet-train on a 2-core machine without a GPU, all cores in use, large images."""
    base = {"batch_size": 64, "threads": 2, "cores": 2, "placement": "cpu", "cuda": False, "passes": FUSED,
            "crop_area": 0.54, "target_short": 256, "decode_share": 0.095, "sizes": ((500, 375), (1024, 768)),
            "mean_shard_mb": 8.8, "total_mb": 70.0, "ram_free_mb": 16000.0, "cold": True}
    return Context(**{**base, **changes})  # type: ignore[arg-type]


def _by_action(recs: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {str(r["action"]).split(" (")[0]: r for r in recs}


def test_the_issue_case_gpu_decode_is_not_first_on_a_machine_without_one() -> None:
    """--step-ms 120 with decode at 9.5% of prep: GPU decode used to rank first."""
    t = Timings(step=0.120, cached=0.330, cold=0.330)  # prep-bound, nothing to fetch
    recs = recommend(t, _ctx())
    by = _by_action(recs)
    gpu = by["GPU decode"]
    assert gpu["rank"] is None and "no GPU on this machine" in str(gpu["why"])
    # its gain stands on the plan's decode share: 9.5% of whole images, the plan decodes 54% crops
    assert gpu["predicted_speedup"] == pytest.approx(1 / (1 - 0.095 * 0.54))
    assert "decode is 5% of prep (10% for whole images" in str(gpu["why"])
    first = next(r for r in recs if r["rank"] == 1)
    assert str(first["action"]).startswith("re-encode smaller images") and first["here"] is True
    assert first["predicted_speedup"] < gpu["predicted_speedup"]  # ranked: doable here, and honestly small


def test_with_a_gpu_gpu_decode_ranks_by_its_gain() -> None:
    recs = recommend(Timings(step=0.120, cached=0.330, cold=0.330), _ctx(cuda=True))
    ranked = [r for r in recs if r["rank"]]
    assert str(ranked[0]["action"]) == "GPU decode (--device gpu)" and ranked[0]["here"] is True
    assert [r["predicted_speedup"] for r in ranked] == sorted((r["predicted_speedup"] for r in ranked), reverse=True)


def test_an_unfused_plan_counts_whole_images() -> None:
    ctx = _ctx(passes=("placement:cpu",))
    assert plan_decode_share(ctx) == 0.095 and plan_decode_share(_ctx()) == pytest.approx(0.095 * 0.54)
    assert plan_decode_share(_ctx(decode_share=None)) is None


def test_equal_gains_at_the_step_cap_rank_by_the_loader_own_gain() -> None:
    """Loader 130 ms, step 120 ms: every change that brings the loader under 120 ms predicts the same x1.08."""
    t = Timings(step=0.120, cached=0.100, cold=0.130)  # 30 ms fetch, 100 ms prep
    recs = recommend(t, _ctx(threads=1, cores=2, decode_share=0.5, passes=("placement:cpu",)))
    ranked = [r for r in recs if r["rank"]]
    assert len(ranked) >= 3
    assert {round(float(r["predicted_speedup"]), 6) for r in ranked} == {round(0.130 / 0.120, 6)}
    loader = [r["predicted_loader_speedup"] for r in ranked]
    assert loader == sorted(loader, reverse=True)
    # re-encoding scales prep by 1.55 and fetch to 29%: 73 ms, more headroom than threads' 30 + 50 ms
    # (which the candidates' order alone would have put first)
    assert str(ranked[0]["action"]).startswith("re-encode smaller images")
    assert str(ranked[1]["action"]).startswith("more threads")


def test_loader_speedup_ignores_the_step() -> None:
    t = Timings(step=0.2, cached=0.1, cold=0.15)
    assert t.speedup(prep_speedup=2.0) == 1.0 and t.loader_speedup(prep_speedup=2.0) == pytest.approx(0.15 / 0.1)


def test_a_negative_start_up_difference_is_not_printed_as_a_duration() -> None:
    window = ReadWindow(epoch_batches=16, batch_size=64, shuffle_buffer=1024, warmup=3, batches=10)
    fetch, basis = window.fetch(steady_s=0.0, startup_s=-0.07)
    assert fetch == 0.0 and "-0.07" not in basis and "came 0.07 s sooner" in basis
    assert "(0.32 s)" in window.fetch(steady_s=0.0, startup_s=0.32)[1]
