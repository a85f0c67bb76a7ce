"""Shipped pipelines by name: load_spec, DataLoader and the CLI, from any working folder."""

from __future__ import annotations

from pathlib import Path

import pytest

import feedfast
from feedfast.cli.main import main
from feedfast.errors import SpecError
from feedfast.spec import load_spec
from feedfast.spec.shipped import resolve_spec_path, shipped_names, shipped_path

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(p.stem for p in (ROOT / "pipelines").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs in an empty folder outside the repository."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_shipped_names_are_the_repository_pipelines() -> None:
    assert shipped_names() == NAMES and "imagenet-train" in NAMES and "imagenet-val" in NAMES


@pytest.mark.parametrize("given", ["imagenet-val", "imagenet-val.yaml", "pipelines/imagenet-val.yaml"])
def test_load_spec_by_name(given: str) -> None:
    spec = load_spec(given)
    assert spec.name == "imagenet-val" and spec.outputs == ("image", "label")
    assert Path(spec.file) == ROOT / "pipelines" / "imagenet-val.yaml"
    assert [op.op for op in spec.fields["image"].ops][:3] == ["decode", "resize", "center_crop"]


def test_overrides_apply_to_a_shipped_name() -> None:
    spec = load_spec("imagenet-train", ["pipeline.image[1].size=192"])
    assert spec.fields["image"].ops[1].params["size"] == 192


def test_a_path_that_exists_wins_over_a_shipped_name(tmp_path: Path) -> None:
    mine = "pipeline:\n  label: [label]\noutputs: [label]\nbatch: {size: 3}\n"
    (tmp_path / "imagenet-train.yaml").write_text(mine)
    (tmp_path / "imagenet-val").write_text(mine)  # no suffix: read as YAML
    for given in ("imagenet-train.yaml", "imagenet-val", str(tmp_path / "imagenet-train.yaml")):
        spec = load_spec(given)
        assert spec.outputs == ("label",) and spec.batch_size == 3, given
    assert resolve_spec_path("imagenet-val") == Path("imagenet-val")


@pytest.mark.parametrize("given", ["imagenet-trian", "nope.yaml", "elsewhere/imagenet-train.yaml",
                                   "imagenet-train.toml", "pipelines/"])
def test_an_unknown_name_lists_the_shipped_ones_and_how_to_give_a_path(given: str) -> None:
    assert shipped_path(given) is None
    with pytest.raises(SpecError, match="spec file not found") as info:
        load_spec(given)
    text = str(info.value)
    assert all(name in text for name in NAMES), text
    assert "give the path of a spec file" in text and "./my-spec.yaml" in text, text


def test_a_misspelt_name_gets_a_suggestion() -> None:
    with pytest.raises(SpecError, match=r"did you mean `imagenet-train`\?"):
        load_spec("imagenet-trian")


def test_dataloader_takes_a_shipped_name(shards: list[str]) -> None:
    loader = feedfast.DataLoader("imagenet-train", shards=shards[:2], batch_size=4, num_workers=1,
                                 overrides=["pipeline.image[1].size=32"])
    try:
        images, labels = next(iter(loader))
    finally:
        loader.close()
    assert loader.spec.name == "imagenet-train"
    assert tuple(images.shape) == (4, 3, 32, 32) and tuple(labels.shape) == (4,)


def test_cli_plan_by_name_and_the_unknown_name_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "imagenet-val"]) == 0
    assert str(ROOT / "pipelines" / "imagenet-val.yaml") in capsys.readouterr().out
    assert main(["plan", "imagenet-trian"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "spec not found: 'imagenet-trian'" in err and all(name in err for name in NAMES)
    assert "did you mean `imagenet-train`?" in err
