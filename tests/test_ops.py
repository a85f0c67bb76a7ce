"""Every op in the registry yields, on DALI's CPU backend, the signature it declares."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import feedfast
from feedfast.compile.build import build_plan
from feedfast.ops.registry import OPS
from feedfast.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TORCH = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8, "int64": torch.int64}

# op -> (its parameters, a fixed-size op after it when it leaves the size free)
IMAGE_OPS: dict[str, tuple[dict[str, Any], list[Any]]] = {
    "decode": ({}, [{"resize": {"size": [24, 20]}}]),
    "random_resized_crop": ({"size": [24, 20]}, []),
    "resize": ({"size": 30}, [{"center_crop": {"size": 24}}]),
    "center_crop": ({"size": 24}, []),
    "random_crop": ({"size": [24, 20]}, []),
    "flip": ({"horizontal": 1.0, "vertical": 0.5}, [{"center_crop": {"size": 24}}]),
    "rotate": ({"angle": 30}, [{"center_crop": {"size": 24}}]),
    "color_jitter": ({"probability": 0.5}, [{"center_crop": {"size": 24}}]),
    "random_grayscale": ({"probability": 0.5}, [{"center_crop": {"size": 24}}]),
    "gaussian_blur": ({"probability": 0.5}, [{"center_crop": {"size": 24}}]),
    "trivial_augment_wide": ({}, [{"center_crop": {"size": 24}}]),
    "rand_augment": ({"flavour": "timm", "magnitude_std": 0.5, "increasing": True}, [{"center_crop": {"size": 24}}]),
    "auto_augment": ({}, [{"center_crop": {"size": 24}}]),
}
TENSOR_OPS = {"random_erasing"}
"""Ops on the normalized tensor (after ``normalize``): tests/test_ops_recipe.py runs them on every backend."""


def _check(loader: feedfast.DataLoader, field: str, value: Any) -> None:
    sig = loader.plan.nodes[loader.plan.outputs[field]].sig
    assert value.dtype == TORCH[sig.dtype], (field, sig)
    assert tuple(value.shape[1:]) == sig.shape, (field, sig)


@pytest.mark.parametrize("op", sorted(IMAGE_OPS))
def test_image_op_yields_declared_signature(op: str, shards: list[str]) -> None:
    params, after = IMAGE_OPS[op]
    chain = ([] if op == "decode" else ["decode"]) + [{op: params}] + after
    for tail, dtype, layout in ((["normalize"], "float32", "CHW"), ([{"normalize": {"dtype": "float16", "layout": "HWC"}}], "float16", "HWC"), ([], "uint8", "HWC")):
        spec = {"pipeline": {"image": chain + tail}, "outputs": ["image"], "batch": {"size": 5}}
        loader = feedfast.DataLoader(spec, shards=shards, num_workers=1)
        (images,) = next(iter(loader))
        _check(loader, "image", images)
        sig = loader.plan.nodes[loader.plan.outputs["image"]].sig
        assert (sig.dtype, sig.layout) == (dtype, layout)


def test_registry_ops_are_all_covered() -> None:
    image_ops = {n for n, o in OPS.items() if not o.host} - {"normalize"} - TENSOR_OPS
    assert image_ops == set(IMAGE_OPS)


def _npy_shard(tmp: Path) -> str:
    path = tmp / "feat-0000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(7):
            buf = io.BytesIO()
            np.save(buf, np.full((4, 3), i, dtype=np.float64))
            for name, data in ((f"s{i}.npy", buf.getvalue()), (f"s{i}.cls", str(i).encode()),
                               (f"s{i}.json", b'{"id": %d, "tag": "x"}' % i), (f"s{i}.txt", b"raw %d" % i)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_generic_ops_and_the_npy_pipeline(tmp_path: Path) -> None:
    shard = _npy_shard(tmp_path)
    loader = feedfast.DataLoader(ROOT / "pipelines/features-npy.yaml", shards=shard, batch_size=3, shuffle=False)
    batches = list(loader)
    feats, labels = batches[0]
    assert feats.dtype == torch.float32 and feats.shape == (3, 4, 3) and labels.tolist() == [0, 1, 2]
    assert float(feats[2, 0, 0]) == 2.0 and sum(len(b[1]) for b in batches) == 7
    spec = {"source": {"components": {"meta": {"ext": "json", "kind": "json"}, "raw": {"ext": "txt", "kind": "bytes"}}},
            "pipeline": {"meta": [{"json": {"field": "id"}}], "raw": ["bytes"]}, "outputs": ["meta", "raw"],
            "batch": {"size": 4}}
    meta, raw = next(iter(feedfast.DataLoader(spec, shards=shard)))
    assert meta == [0, 1, 2, 3] and raw == [b"raw 0", b"raw 1", b"raw 2", b"raw 3"]


def test_two_views_share_one_decode_and_differ(shards: list[str]) -> None:
    spec = load_spec(ROOT / "pipelines/ssl-twoview.yaml", ["pipeline.view1.ops[1].size=32", "pipeline.view2.ops[1].size=32"])
    assert [n.op for n in build_plan(spec, device="cpu").nodes].count("decode") == 1
    loader = feedfast.DataLoader(spec, shards=shards, batch_size=4, num_workers=1)
    batch = next(iter(loader))
    assert set(batch) == {"view1", "view2"} and batch["view1"].shape == (4, 3, 32, 32)
    assert not torch.equal(batch["view1"], batch["view2"])


def test_fp16_pipeline_yields_half(shards: list[str]) -> None:
    loader = feedfast.DataLoader(ROOT / "pipelines/imagenet-train-fp16.yaml", shards=shards, batch_size=4,
                                 overrides=["pipeline.image[1].size=32"], num_workers=1)
    images, _ = next(iter(loader))
    assert images.dtype == torch.float16 and images.shape == (4, 3, 32, 32)
