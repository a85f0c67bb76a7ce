"""``feedfast bench``: its figures, the comparison's rounds (a new loader per round, built, timed
and closed before the next), the stall at a simulated step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from feedfast.cli.main import main
from tests.helpers import needs

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--batch-size", "4", "--threads", "1", "--set", "pipeline.image[1].size=32", "--quiet"]


@needs("torchvision")
def test_bench_writes_figures(shards: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.json"
    code = main(["bench", str(ROOT / "pipelines/imagenet-train.yaml"), "--shards", ",".join(shards), "--batch-size", "4",
                 "--batches", "3", "--rounds", "2", "--warmup", "1", "--threads", "1", "--set",
                 "pipeline.image[1].size=32", "--json", str(out), "--quiet", "--compare", "torch"])
    assert code == 0
    res = json.loads(out.read_text())
    for key in ("samples_per_s", "mb_per_s", "batches", "samples", "time_to_first_batch_s", "cpu_util", "cpu_s",
                "peak_rss_mb", "skipped", "padded", "rounds", "round_samples_per_s", "warmup_per_round"):
        assert key in res, key
    # 23 samples in batches of 4; each round a new loader: 1 warm-up batch, then batches 2 to 4 of its first epoch
    assert res["batches"] == 6 and res["samples"] == 24 and res["rounds"] == 2 and res["samples_per_s"] > 0
    assert res["warmup_per_round"] == 1 and res["time_to_first_batch_s"] > 0 and res["cpu_s"] >= 0
    c = res["compare"]
    assert c["baseline"] == "torch" and c["samples_per_s"] > 0 and c["batches"] == 6 and c["samples"] == 24
    assert c["order"] == [["feedfast", "torch"], ["torch", "feedfast"]]
    assert len(c["ratio_spread"]["ratios"]) == 2 and c["ratio"] == pytest.approx(c["ratio_spread"]["median"])
    assert c["ratio_spread"]["ratios"] == pytest.approx([a / b for a, b in zip(res["round_samples_per_s"],
                                                                               c["round_samples_per_s"])])
    assert c["peak_rss_mb"] > 0 and "RandomResizedCrop(size=(32, 32)" in c["recipe"] and c["warmup_per_round"] == 1
    assert c["samples_per_cpu_s"]["torch"] == (pytest.approx(c["samples"] / c["cpu_s"]) if c["cpu_s"] > 0 else None)
    assert "settle_s_per_round" not in c and "settle_s_per_round" not in res
    text = capsys.readouterr().out
    assert "ratio feedfast/torch" in text and "2 rounds)" in text and "torch first in round 2" in text
    assert "ratio per CPU second" in text


@pytest.mark.parametrize("compare", [pytest.param(["--compare", "torch", "--rounds", "3"], marks=needs("torchvision")),
                                     []])
def test_each_round_builds_a_new_loader_and_closes_it_before_the_next(
        shards: list[str], monkeypatch: pytest.MonkeyPatch, compare: list[str]) -> None:
    from feedfast.cli import bench

    events: list[str] = []
    loaders: list[Any] = []  # held, so that no two rounds' loaders share an id

    def recorded(build: Any) -> Any:
        def wrapped(*args: Any, **kw: Any) -> Any:
            contender = build(*args, **kw)
            if contender.name == "feedfast":
                loaders.append(args[0])  # the DataLoader it wraps
            events.append(f"build {contender.name}")
            close = contender.close

            def closing() -> None:
                events.append(f"close {contender.name}")
                close()

            contender.close = closing
            return contender
        return wrapped

    real_round = bench.time_round

    def time_round(make: Any, plan: Any) -> Any:
        events.append(f"round {plan.label}")
        return real_round(make, plan)

    from feedfast.baseline import contenders  # bench imports these when it runs (torch: not at the parser)

    monkeypatch.setattr(contenders, "feedfast_contender", recorded(contenders.feedfast_contender))
    monkeypatch.setattr(contenders, "make_baseline", recorded(contenders.make_baseline))
    monkeypatch.setattr(bench, "time_round", time_round)
    assert main(["bench", "imagenet-train", "--shards", ",".join(shards), "--batches", "1", "--warmup", "1",
                 *SMALL, *compare, "--json", "-"]) == 0
    if compare:
        rounds = [("feedfast", "1/3"), ("torch", "1/3"), ("torch", "2/3"), ("feedfast", "2/3"), ("feedfast", "3/3"),
                  ("torch", "3/3")]
        assert events == [e for name, k in rounds for e in (f"round {name} {k}", f"build {name}", f"close {name}")]
        assert len({id(x) for x in loaders}) == 3  # a new DataLoader each round
    else:  # without --compare: one loader, one run
        assert events == ["round feedfast", "build feedfast", "close feedfast"] and len(loaders) == 1


def test_bench_compare_dali(shards: list[str], tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    assert main(["bench", "imagenet-train", "--shards", ",".join(shards), "--batch-size", "4", "--batches", "2",
                 "--rounds", "2", "--warmup", "1", "--threads", "1", "--set", "pipeline.image[1].size=32",
                 "--compare", "dali", "--json", str(out), "--quiet"]) == 0
    c = json.loads(out.read_text())["compare"]
    assert c["baseline"] == "dali" and c["samples_per_s"] > 0 and c["ratio"] > 0
    assert c["recipe"].startswith("hand-written DALI (CPU, 1 threads)")


@pytest.mark.parametrize("rounds,batches", [(1, 12), (2, 6)])
def test_bench_counts_delivered_samples_not_padding(shards: list[str], tmp_path: Path, rounds: int,
                                                    batches: int) -> None:
    out = tmp_path / "b.json"
    assert main(["bench", "imagenet-train", "--shards", ",".join(shards), "--batches", str(batches), "--warmup", "0",
                 "--rounds", str(rounds), *SMALL, "--set", "batch.last_batch=pad", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    # each round a new loader from its epoch 0: 6 batches an epoch, the last padded by 1; 12 batches in all
    assert res["batches"] == 12 and res["padded"] == 2 and res["samples"] == 48 - 2
    assert len(res["round_samples_per_s"]) == rounds
    if rounds == 1:
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


def test_compare_rows_print_the_median_ratio_and_its_spread(capsys: pytest.CaptureFixture[str]) -> None:
    from feedfast.cli.bench import _compare_rows, compare_figures

    def figs(rates: list[float], cpu_s: float) -> dict:
        return {"samples_per_s": sorted(rates)[len(rates) // 2], "round_samples_per_s": rates, "rounds": len(rates),
                "batches": 4, "samples": 16, "wall_s": 1.0, "cpu_s": cpu_s, "time_to_first_batch_s": 0.5,
                "cpu_util": 90.0, "peak_rss_mb": 700.0, "stall_fraction": None, "verdict": "no steps measured",
                "warmup_per_round": 3}

    runs = {"feedfast": figs([300.0, 200.0, 100.0, 400.0], 2.0), "torch": {**figs([100.0] * 4, 1.0), "cpu_util": 45.0}}
    c = compare_figures("torch", "torchvision", runs, step=False)
    assert c["ratio"] == 2.5 and c["order"][1] == ["torch", "feedfast"] and c["recipe"] == "torchvision"
    rows = dict(_compare_rows(c))
    assert rows["ratio feedfast/torch"] == "2.50x (min 1.00, max 4.00; IQR 1.75-3.25; 4 rounds)"
    assert rows["round order"] == "feedfast first in rounds 1, 3; torch first in rounds 2, 4"
    assert rows["torch samples/s"] == "100.0 (median of 4 rounds)"
    assert rows["torch CPU / peak RSS"].startswith("45 % / 700 MB")
    # 16 samples each, in 2 CPU seconds for feedfast and 1 for torch: half torch's samples per CPU second
    assert c["samples_per_cpu_s"] == {"feedfast": 8.0, "torch": 16.0}
    assert c["ratio_per_cpu_s"] == pytest.approx(0.5) and rows["ratio per CPU second"].startswith("0.50x (feedfast 8,")


@needs("torchvision")
@pytest.mark.parametrize("aug,named", [({"trivial_augment_wide": {}}, "TrivialAugmentWide("),
                                       ({"rand_augment": {}}, "NOT in this baseline (the ratio is not like for like): "
                                                              "rand_augment")])
def test_compare_torch_runs_the_spec_s_recipe_or_names_what_it_leaves_out(shards: list[str], tmp_path: Path, aug: dict,
                                                                          named: str) -> None:
    """The torch baseline of a recipe spec runs torchvision's own TrivialAugmentWide, RandomErasing and the reference's
    MixUp/CutMix collate (the same work); an op it has no form for is named in its description."""
    spec = {"version": 1, "name": "small-recipe", "seed": 3, "outputs": ["image", "label"],
            "pipeline": {"image": ["decode", {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5}}, aug,
                                   "normalize", {"random_erasing": {"probability": 0.5}}], "label": ["label"]},
            "batch": {"size": 4, "mix": {"mixup_alpha": 0.2, "cutmix_alpha": 1.0, "num_classes": 10,
                                         "convention": "torchvision"}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(spec))
    out = tmp_path / "b.json"
    assert main(["bench", str(path), "--shards", ",".join(shards), "--batches", "2", "--rounds", "2", "--warmup", "1",
                 "--threads", "1", "--json", str(out), "--quiet", "--compare", "torch"]) == 0
    recipe = json.loads(out.read_text())["compare"]["recipe"]
    assert named in recipe and "RandomErasing(p=0.5" in recipe and "MixUp(0.2), CutMix(1)" in recipe
