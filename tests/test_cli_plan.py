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
