"""``feedfast plan``: its header tells where the pipeline runs and where the batches go."""

from __future__ import annotations

import json

import pytest

from feedfast.cli.main import main


def _first_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["plan", "imagenet-train", *args]) == 0
    return capsys.readouterr().out.splitlines()[0]


def test_header_names_the_consumer_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    line = _first_line(capsys, "--consumer", "cuda", "--device", "cpu")
    assert "pipeline on cpu (device cpu), batches to cuda" in line and "consumer cpu" not in line
    assert "image normalized on cuda after a uint8 copy" in line  # the cheap-transfer pass, said in words


def test_header_with_the_defaults_and_on_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert "pipeline on cpu (device cpu), batches to cpu" in _first_line(capsys, "--device", "cpu")
    line = _first_line(capsys, "--device", "gpu", "--consumer", "cuda")
    assert line.endswith("pipeline on gpu (device gpu), batches to cuda")  # nothing deferred on the GPU
    assert "imagenet-train.yaml" in line


def test_json_records_the_consumer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "imagenet-train", "--consumer", "cuda", "--device", "cpu", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["consumer"] == "cuda" and plan["placement"] == "cpu"


def _backend_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["plan", *args]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("backend:"))


def test_the_backend_line_says_what_auto_runs_and_how(capsys: pytest.CaptureFixture[str]) -> None:
    from feedfast.loader.backends.cpu import batchplan
    line = _backend_line(capsys, "imagenet-train", "--device", "cpu")
    assert "auto: threads, because every op runs on the threaded path" in line
    assert "(local and remote shards alike: remote ones read by range ahead of decoding)" in line
    if batchplan.ext is not None:
        assert "each chunk planned in C" in line
    assert "dali, because the pipeline is placed on gpu" in _backend_line(capsys, "imagenet-train", "--device", "gpu")


def test_an_op_the_threaded_path_lacks_is_named_in_plan_and_in_a_log_line(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from feedfast.compile.build import build_plan
    from feedfast.loader.backends.choose import choose_backend
    from feedfast.sources.dataset import ShardSet
    from feedfast.spec import load_spec

    line = _backend_line(capsys, "ssl-twoview", "--device", "cpu")
    assert "dali, because op `color_jitter` (pipeline.view1.ops[3]) is not one the threaded path runs" in line
    spec = load_spec({"pipeline": {"image": ["decode", {"rotate": {"angle": 10}}, {"resize": {"size": [8, 8]}}]},
                      "outputs": ["image"], "batch": {"size": 2}})
    with caplog.at_level(logging.INFO, logger="feedfast"):
        assert choose_backend("auto", build_plan(spec, device="cpu"), ShardSet((), (), ())) == "dali"
    assert any("backend auto chose dali: op `rotate` (pipeline.image[1])" in r.getMessage() for r in caplog.records)


def test_it_says_which_nodes_dali_is_fed_draws_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "imagenet-train", "--device", "gpu"]) == 0
    draws = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  draws:")]
    assert draws and "[2] its crop window (decoders.image_slice + resize)" in draws[0]
    assert "[3] its flips (crop_mirror_normalize mirror)" in draws[0]
    assert main(["plan", "imagenet-val", "--device", "gpu"]) == 0  # nothing random: nothing fed
    assert "draws:" not in capsys.readouterr().out
