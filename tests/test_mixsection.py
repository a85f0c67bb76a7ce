"""The spec's ``batch.mix`` section (feedfast.spec.batchmix_section): validated, printed back, shown by ``feedfast plan``."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

import feedfast
from feedfast.errors import SpecError
from tests.test_mix_batch import MIX, _spec


def test_plan_shows_the_mix_and_the_spec_prints_it_back(small_spec: dict, tmp_path: Path) -> None:
    import yaml

    spec = feedfast.load_spec(_spec(small_spec))
    assert spec.mix is not None and spec.mix.image == "image" and spec.mix.label == "label"
    assert feedfast.load_spec(spec.to_dict()).mix == spec.mix
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(spec.to_dict()))
    out = subprocess.run([sys.executable, "-m", "feedfast", "plan", str(path), "--device", "cpu"],
                         capture_output=True, text=True, check=True).stdout
    assert "mix:     mixup alpha 0.8 / cutmix alpha 1, cutmix with p 0.5, p 1 per elem" in out
    assert "soft targets [batch, 10]" in out


@pytest.mark.parametrize("mix,key", [
    ({"mixup_alpha": 0.8}, "batch.mix.num_classes"),
    ({**MIX, "mode": "pairs"}, "batch.mix.mode"),
    ({**MIX, "prob": 2}, "batch.mix.prob"),
    ({**MIX, "mixupalpha": 1}, "batch.mix.mixupalpha"),
    ({**MIX, "label": "image"}, "batch.mix.label"),
    ({**MIX, "cutmix_minmax": [0.9, 0.1]}, "batch.mix.cutmix_minmax"),
    ("mixup", "batch.mix"),
])
def test_bad_mix_names_file_key_value_and_fix(small_spec: dict, mix: object, key: str) -> None:
    spec = copy.deepcopy(small_spec)
    spec["batch"]["mix"] = mix
    with pytest.raises(SpecError) as err:
        feedfast.load_spec(spec)
    assert err.value.key == key and "<dict>" in str(err.value) and err.value.fix


def test_which_outputs_are_mixed_is_told_when_ambiguous(small_spec: dict) -> None:
    spec = _spec(small_spec)
    spec["pipeline"]["other"] = {"from": "image", "ops": ["decode", {"center_crop": {"size": 16}}, "normalize"]}
    spec["outputs"] = ["image", "other", "label"]
    with pytest.raises(SpecError, match="cannot tell which output is the image: 2 candidates") as err:
        feedfast.load_spec(spec)
    assert err.value.key == "batch.mix.image"
    spec["batch"]["mix"]["image"] = "other"
    assert feedfast.load_spec(spec).mix.image == "other"  # type: ignore[union-attr]


def test_torchvision_recipe_is_expressible(small_spec: dict) -> None:
    recipe = {"mixup_alpha": 0.2, "cutmix_alpha": 1.0, "switch_prob": 0.5, "prob": 1.0, "label_smoothing": 0.1,
              "convention": "torchvision", "num_classes": 10}
    spec = copy.deepcopy(small_spec)
    spec["batch"]["mix"] = recipe
    assert feedfast.load_spec(spec).mix.convention == "torchvision"  # type: ignore[union-attr]
