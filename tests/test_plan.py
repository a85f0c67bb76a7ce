"""The compiler: signatures, placement, fusion, cheap transfer, and GPU graphs on a CPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedfast.compile.build import build_plan
from feedfast.compile.dali import ReaderConfig, build_pipeline
from feedfast.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "pipelines").glob("*.yaml"))


def test_train_plan_fuses_roi_decode_and_flip_into_normalize() -> None:
    plan = build_plan(load_spec(ROOT / "pipelines/imagenet-train.yaml"), device="cpu")
    ops = [n.dali_op for n in plan.nodes]
    assert "decoders.image_random_crop+resize" in ops
    assert "crop_mirror_normalize" in ops and "flip" not in ops
    image = plan.nodes[plan.outputs["image"]]
    assert image.sig.shape == (3, 224, 224) and image.sig.dtype == "float32" and image.sig.layout == "CHW"


def test_gpu_placement_uses_the_mixed_decoder() -> None:
    plan = build_plan(load_spec(ROOT / "pipelines/imagenet-val.yaml"), device="gpu")
    devices = {n.dali_op: n.device for n in plan.nodes}
    assert devices["decoders.image"] == "mixed"
    assert devices["resize"] == "gpu" and devices["crop_mirror_normalize"] == "gpu"


def test_cheap_transfer_defers_normalize_for_cuda_consumers() -> None:
    spec = load_spec(ROOT / "pipelines/imagenet-train.yaml")
    plan = build_plan(spec, device="cpu", consumer="cuda")
    image = plan.nodes[plan.outputs["image"]]
    assert image.deferred and image.dali_op == "(torch) normalize"
    assert plan.nodes[image.inputs[0]].op == "flip"  # flip stays in DALI, uint8 crosses the bus


def test_shared_decode_feeds_two_views_without_fusion() -> None:
    spec = load_spec({
        "pipeline": {
            "a": {"from": "image", "ops": ["decode", {"random_resized_crop": {"size": 16}}, "normalize"]},
            "b": {"from": "image", "ops": ["decode", {"center_crop": {"size": 16}}, "normalize"]},
        },
    })
    plan = build_plan(spec, device="cpu")
    assert [n.op for n in plan.nodes].count("decode") == 1


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_gpu_plan_of_every_shipped_pipeline_serializes_in_dali(path: Path) -> None:
    plan = build_plan(load_spec(path), device="gpu")
    reader = ReaderConfig(paths=["x.tar"], index_paths=["x.idx"])
    pipe, _ = build_pipeline(plan, reader, batch_size=2, num_threads=1, device_id=None, seed=1)
    text = pipe.serialize()
    has_images = any(c.kind == "image" for c in plan.spec.components.values())
    assert isinstance(text, bytes) and (b"mixed" in text) == has_images
    assert b"readers__Webdataset" in text or b"readers.webdataset" in text or b"WebdatasetReader" in text
