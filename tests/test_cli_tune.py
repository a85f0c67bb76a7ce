"""``feedfast tune``: the search on a simulated step, per backend, printed as a spec section to paste."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from feedfast.cli.main import main
from feedfast.cli.tune import HW_LOADS, candidates
from feedfast.loader import autotune as tune
from feedfast.spec import load_spec
from tests.helpers import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("clitune"), samples=40, per_shard=10, seed=7)


def test_tune_prints_trials_and_a_loader_section_that_loads(shards: list[str], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tune.json"
    code = main(["tune", "imagenet-train", "--shards", ",".join(shards), "--batch-size", "2", "--step-ms", "1",
                 "--confirm", "3", "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "backend threads (cpu)" in text and "backend dali (cpu)" in text
    section = text.split("# paste into the spec (chosen: the shortest measured period)\n", 1)[1]
    pasted = yaml.safe_load("\n".join(line for line in section.splitlines() if not line.startswith("#")))
    spec = load_spec({**yaml.safe_load(Path("pipelines/imagenet-train.yaml").read_text()), **pasted})
    report = json.loads(out.read_text())
    chosen = report["chosen"]
    assert (spec.loader.backend, spec.loader.threads, spec.loader.prefetch) == (
        chosen["backend"], chosen["threads"], chosen["prefetch"])
    for result in report["results"]:
        assert result["state"] == "done" and result["trials"][0]["batches"] == tune.MEASURE
        assert result["confirmed_ms"] > 0


def test_tune_rejects_a_bad_budget(shards: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--shards", ",".join(shards), "--budget", "1.5"]) == 2
    assert "--budget" in capsys.readouterr().err


def test_candidates_cover_gpu_placement_and_hardware_decoder_shares_only_with_cuda() -> None:
    assert [(c["backend"], c["placement"]) for c in candidates("auto", "threads", None, cuda=False)] == [
        ("threads", "cpu"), ("dali", "cpu")]
    assert [(c["backend"], c["placement"]) for c in candidates("auto", "dali", None, cuda=False)] == [("dali", "cpu")]
    on_gpu = candidates("auto", "dali", None, cuda=True)
    assert [c["overrides"] for c in on_gpu if c["placement"] == "gpu"] == [
        [f"decoder.hw_decoder_load={h}"] for h in HW_LOADS]
    assert [(c["backend"], c["placement"]) for c in on_gpu if c["placement"] == "cpu"] == [
        ("threads", "cpu"), ("dali", "cpu")]
    assert all(c["placement"] == "gpu" for c in candidates("auto", "dali", "gpu", cuda=True))
    assert [c["backend"] for c in candidates("dali,pil", "threads", "cpu", cuda=False)] == ["dali", "pil"]
