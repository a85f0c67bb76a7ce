"""Spec loading, validation messages and overrides."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from feedfast.errors import SpecError
from feedfast.spec import load_spec
from tests.helpers import SMALL_SPEC

ROOT = Path(__file__).resolve().parents[1]


def _with(path: list, value: object) -> dict:
    raw = copy.deepcopy(SMALL_SPEC)
    node = raw
    for step in path[:-1]:
        node = node[step]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return raw


# (raw spec, key path in the message, a phrase of the message, a phrase of the fix/allowed)
MISTAKES = [
    (_with(["sede"], 1), "sede", "unknown key", "did you mean `seed`"),
    (_with(["pipeline", "image", 1], {"random_resized_crap": {"size": 32}}), "pipeline.image[1]", "unknown op",
     "did you mean `random_resized_crop`"),
    (_with(["pipeline", "image", 1], {"random_resized_crop": {"sise": 32}}), "pipeline.image[1].sise",
     "unknown parameter", "did you mean `size`"),
    (_with(["pipeline", "image", 1], {"random_resized_crop": {"size": "big"}}), "pipeline.image[1].size",
     "bad value", "an integer or [height, width]"),
    (_with(["pipeline", "image", 1], {"random_resized_crop": {"size": 0}}), "pipeline.image[1].size",
     "bad value", "[1, 16384]"),
    (_with(["pipeline", "image", 1], {"random_resized_crop": {"scale": [0.9, 0.1]}}), "pipeline.image[1].scale",
     "bad value", "low <= high"),
    (_with(["pipeline", "image", 2], {"flip": {"horizontal": 1.5}}), "pipeline.image[2].horizontal",
     "bad value", "[0, 1]"),
    (_with(["pipeline", "image", 3], {"normalize": {"layout": "NCHW"}}), "pipeline.image[3].layout",
     "bad value", "'CHW', 'HWC'"),
    (_with(["pipeline", "image"], ["normalize", "decode"]), "pipeline.image[0]", "impossible chain",
     "put `decode` first"),
    (_with(["pipeline", "image"], ["decode", "normalize", {"center_crop": {"size": 8}}]), "pipeline.image[2]",
     "impossible chain", "before `normalize`"),
    (_with(["pipeline", "image"], ["decode", "normalize"]), "pipeline.image", "share one size",
     "fixed-size op"),
    (_with(["outputs"], ["image", "labels"]), "outputs[1]", "does not define", "did you mean `label`"),
    (_with(["batch"], {"size": 0}), "batch.size", "bad batch size", ">= 1"),
    (_with(["batch"], {"size": 4, "last_batch": "keep"}), "batch.last_batch", "bad value", "partial"),
    (_with(["device"], "tpu"), "device", "bad value", "'auto', 'cpu', 'gpu'"),
    (_with(["pipeline", "label"], {"from": "labl", "ops": ["label"]}), "pipeline.label.from",
     "not declared", "did you mean `label`"),
    (_with(["pipeline", "label"], []), "pipeline.label", "non-empty list", "bytes"),
    (_with(["pipeline", "image", 0], {"decode": 3}), "pipeline.image[0]", "must be a mapping", "decode"),
    (_with(["pipeline", "label"], ["label", "decode"]), "pipeline.label[1]", "cannot follow a host op",
     "image ops"),
    (_with(["shuffle"], {"buffer": -1}), "shuffle.buffer", "bad shuffle buffer", ">= 0"),
    (_with(["decoder"], {"hw_decoder_load": 1.5}), "decoder.hw_decoder_load", "bad value", "a number in [0, 1]"),
    (_with(["decoder"], {"hw_decoder_load": "max"}), "decoder.hw_decoder_load", "hardware JPEG decoder",
     "remove the key for the default, 0.65"),
    (_with(["decoder"], {"hw_decoder_lod": 0.5}), "decoder.hw_decoder_lod", "unknown key",
     "did you mean `hw_decoder_load`"),
    (_with(["decoder"], {"device_memory_padding": -1}), "decoder.device_memory_padding", "bad value",
     "an integer in [0, inf]"),
    (_with(["decoder"], {"host_memory_padding": 1.5e8}), "decoder.host_memory_padding", "bad value", "an integer"),
    (_with(["decoder"], {"preallocate_width_hint": 70000}), "decoder.preallocate_width_hint", "bad value",
     "[0, 65535]"),
    (_with(["decoder"], {"preallocate_height_hint": True}), "decoder.preallocate_height_hint", "bad value",
     "remove the key for the default, 6430"),
    (_with(["decoder"], 0.65), "decoder", "must be a mapping", "hw_decoder_load"),
]


@pytest.mark.parametrize("raw,key,message,hint", MISTAKES)
def test_mistakes_name_key_value_and_fix(raw: dict, key: str, message: str, hint: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(raw)
    text = str(info.value)
    assert info.value.key == key, text
    assert text.startswith(f"<dict>: {key}: "), text
    assert message in text and hint in text, text


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="spec file not found") as info:
        load_spec(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(info.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: [unclosed\n")
    with pytest.raises(SpecError, match="bad.yaml: cannot parse"):
        load_spec(bad)
    bad.write_text("pipeline:\n  image: [decode, {resize: {size: 256}}, {center_crop: {size: 224}}, normalise]\n")
    with pytest.raises(SpecError, match=r"bad.yaml: pipeline.image\[3\]: unknown op.*did you mean `normalize`"):
        load_spec(bad)


def test_yaml_toml_and_dict_give_the_same_spec(tmp_path: Path) -> None:
    yaml_spec = load_spec(ROOT / "pipelines" / "imagenet-val.yaml")
    toml = tmp_path / "val.toml"
    toml.write_text(
        'version = 1\nname = "imagenet-val"\noutputs = ["image", "label"]\n'
        '[source.components.image]\next = "jpg;jpeg;png"\nkind = "image"\n'
        '[source.components.label]\next = "cls"\nkind = "label"\n'
        '[pipeline]\nimage = ["decode", {resize = {size = 256, interpolation = "linear"}}, '
        '{center_crop = {size = 224}}, {normalize = {mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225]}}]\n'
        'label = ["label"]\n[batch]\nsize = 64\nlast_batch = "partial"\n'
    )
    toml_spec = load_spec(toml)
    assert toml_spec.fields == yaml_spec.fields
    assert load_spec(yaml_spec.to_dict()).fields == yaml_spec.fields


def test_overrides_set_op_params_and_settings() -> None:
    spec = load_spec(ROOT / "pipelines" / "imagenet-train.yaml",
                     ["pipeline.image[1].size=192", "batch.size=16", "seed=7", "pipeline.image[2].horizontal=0.0"])
    assert spec.fields["image"].ops[1].params["size"] == 192
    assert spec.fields["image"].ops[2].params["horizontal"] == 0.0
    assert (spec.batch_size, spec.seed) == (16, 7)
    with pytest.raises(SpecError, match="key.path=value"):
        load_spec(SMALL_SPEC, ["batch.size"])
    with pytest.raises(SpecError, match=r"pipeline.image\[1\].size"):
        load_spec(SMALL_SPEC, ["pipeline.image[1].size=-3"])


def test_every_shipped_pipeline_loads() -> None:
    files = sorted((ROOT / "pipelines").glob("*.yaml"))
    assert len(files) >= 2
    for f in files:
        spec = load_spec(f)
        assert spec.outputs and spec.fields


def test_one_image_feeds_two_views() -> None:
    raw = {
        "pipeline": {
            "view1": {"from": "image", "ops": ["decode", {"random_resized_crop": {"size": 16}}, "normalize"]},
            "view2": {"from": "image", "ops": ["decode", {"random_resized_crop": {"size": 16}}, "normalize"]},
        },
        "outputs": {"view1": "view1", "view2": "view2"},
    }
    spec = load_spec(raw)
    assert spec.output_form == "dict" and spec.outputs == ("view1", "view2")


def test_committed_spec_reference_matches_the_registry() -> None:
    from feedfast.ops.registry import OPS
    from feedfast.spec.reference import render_reference

    page = (ROOT / "docs" / "spec-reference.md").read_text(encoding="utf-8")
    assert page == render_reference(), "run: python -m feedfast.spec.reference > docs/spec-reference.md"
    for name, op in OPS.items():
        assert f"### `{name}`" in page
        for p in op.params:
            assert f"| `{p.name}` |" in page


def test_decoder_defaults_are_nvidias_and_a_key_can_be_set(tmp_path: Path) -> None:
    from feedfast.spec.model import DECODER_PARAMS, DecoderSettings

    assert load_spec(SMALL_SPEC).decoder == DecoderSettings(
        hw_decoder_load=0.65, device_memory_padding=211025920, host_memory_padding=140544512,
        preallocate_width_hint=5980, preallocate_height_hint=6430)
    assert DecoderSettings().to_dict() == {p.name: p.default for p in DECODER_PARAMS}
    spec = load_spec(_with(["decoder"], {"hw_decoder_load": 1, "preallocate_width_hint": 0}))
    assert spec.decoder.hw_decoder_load == 1.0 and isinstance(spec.decoder.hw_decoder_load, float)
    assert spec.decoder.preallocate_width_hint == 0 and spec.decoder.device_memory_padding == 211025920
    assert load_spec(spec.to_dict()).decoder == spec.decoder
    assert load_spec(SMALL_SPEC, ["decoder.hw_decoder_load=0.75"]).decoder.hw_decoder_load == 0.75
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: {image: [decode, {center_crop: {size: 8}}]}\ndecoder: {hw_decoder_load: 2}\n")
    with pytest.raises(SpecError, match=r"bad.yaml: decoder.hw_decoder_load: bad value.*got 2.*allowed: a number in"):
        load_spec(bad)


def test_decoder_settings_apply_to_the_mixed_device_only() -> None:
    from feedfast.spec.model import DecoderSettings

    settings = DecoderSettings(hw_decoder_load=0.75)
    assert settings.args_for("mixed")["hw_decoder_load"] == 0.75
    assert settings.args_for("cpu") == {} and settings.args_for("gpu") == {}
