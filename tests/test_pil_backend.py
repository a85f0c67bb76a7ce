"""The portable backend: PIL programs compiled from specs, run in torch DataLoader workers."""

from __future__ import annotations

import dataclasses
import io
import random
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import feedfast
from feedfast import _env
from feedfast.checks.decoders import DaliDecoder
from feedfast.compile.build import build_plan
from feedfast.compile.pil import compile_pil
from feedfast.errors import BackendError, SampleError
from feedfast.loader.backends.cpu.pil import run_pil_epoch
from feedfast.loader.batch import Batch
from feedfast.ops.registry import OPS
from feedfast.order.deal import EpochPlan, plan_epoch, step_positions
from feedfast.shards.index.tarindex import load_index
from feedfast.sources.dataset import ShardSet, open_shards
from feedfast.spec import load_spec
from tests.helpers import SMALL_SPEC, shard_with_bad_sample
from tests.jpegcases import jpeg as make_jpeg
from tests.jpegcases import lossless_jpeg, pillow_rejects_dali_decodes

ROOT = Path(__file__).resolve().parents[1]
VAL = ROOT / "pipelines/imagenet-val.yaml"
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def _pil_epoch(spec: Any, shards: list[str], *, rank: int = 0, world: int = 1, workers: int = 0, epoch: int = 0,
               start: int = 0) -> list[Batch]:
    spec = load_spec(spec)
    sset = open_shards(shards, spec, _env.cache_dir())
    ep = plan_epoch(list(sset.sizes), batch_size=spec.batch_size, rank=rank, world=world,
                    last_batch=spec.last_batch, seed=spec.seed, epoch=epoch, shuffle_shards=spec.shuffle_shards)
    return list(run_pil_epoch(build_plan(spec, device="cpu"), sset, ep, rank=rank, world=world,
                              batch_size=spec.batch_size, workers=workers, seed=spec.seed, epoch=epoch, start=start))


def _keys(batches: list[Batch]) -> list[list[str]]:
    return [[k for _, k in b.origins] for b in batches]


# --- every image op yields what it declares --------------------------------------------------

IMAGE_OP_CASES: dict[str, list[Any]] = {
    "crop": ["decode", {"center_crop": {"size": [20, 28]}}],
    "gray-resize": [{"decode": {"color": "gray"}}, {"resize": {"size": [20, 28]}}],
    "rrc": ["decode", {"random_resized_crop": {"size": [20, 28]}}],
    "shorter-then-padded-crop": ["decode", {"resize": {"size": 24, "interpolation": "cubic"}},
                                 {"center_crop": {"size": [20, 140]}}],
    "flip-rotate-random-crop": ["decode", {"flip": {"horizontal": 0.5, "vertical": 0.5}}, {"rotate": {"angle": 30}},
                                {"random_crop": {"size": [20, 140]}}],
    "colour-normalize": ["decode", "color_jitter", {"random_grayscale": {"probability": 0.5}},
                         {"gaussian_blur": {"probability": 0.5}}, {"resize": {"size": [20, 28]}}, "normalize"],
    "gray-normalize-hwc-half": [{"decode": {"color": "gray"}}, {"center_crop": {"size": [20, 28]}},
                                {"normalize": {"mean": [0.5], "std": [0.25], "dtype": "float16", "layout": "HWC"}}],
    "recipe": ["decode", {"random_resized_crop": {"size": [20, 28]}}, "trivial_augment_wide",
               {"rand_augment": {"flavour": "timm", "increasing": True, "magnitude_std": 0.5}}, "auto_augment",
               "normalize", {"random_erasing": {"value": "random"}}],
    "gray-recipe-hwc": [{"decode": {"color": "gray"}}, {"center_crop": {"size": [20, 28]}}, "rand_augment",
                        {"normalize": {"mean": [0.5], "std": [0.25], "layout": "HWC"}},
                        {"random_erasing": {"probability": 1.0, "value": 1.5}}],
}


def _jpegs(shards: list[str]) -> dict[str, bytes]:
    """Every sample's JPEG by key, read with tarfile (independently of feedfast's index)."""
    out = {}
    for path in shards:
        with tarfile.open(path) as tar:
            for m in tar:
                if m.name.endswith(".jpg"):
                    out[m.name[:-4]] = tar.extractfile(m).read()  # type: ignore[union-attr]
    return out


def _matches(value: Any, sig: Any) -> bool:
    """Whether one sample's value (a PIL image or a tensor) has the declared dtype and shape."""
    if isinstance(value, Image.Image):
        arr = np.asarray(value)
        shape, dtype = (arr.shape if arr.ndim == 3 else (*arr.shape, 1)), str(arr.dtype)
    else:
        shape, dtype = tuple(value.shape), str(value.dtype).removeprefix("torch.")
    return dtype == sig.dtype and len(shape) == len(sig.shape) and all(
        d is None or d == n for d, n in zip(sig.shape, shape))


def test_the_cases_cover_every_image_op_in_the_registry() -> None:
    used = {next(iter(op)) if isinstance(op, dict) else op for ops in IMAGE_OP_CASES.values() for op in ops}
    assert used == {name for name, op in OPS.items() if not op.host}


@pytest.mark.parametrize("ops", list(IMAGE_OP_CASES.values()), ids=list(IMAGE_OP_CASES))
def test_every_image_op_yields_its_declared_shape_dtype_and_layout(ops: list[Any], shards: list[str]) -> None:
    spec = load_spec({"pipeline": {"image": ops, "label": ["label"]}, "outputs": ["image", "label"],
                      "batch": {"size": 8}, "seed": 5})
    program = compile_pil(spec)
    for jpeg in list(_jpegs(shards).values())[:6]:  # every step of the program, on one sample at a time
        values = program.trace([jpeg, b"3"], random.Random(7))
        for step, value in zip(program.steps, values):
            assert step.sig.kind not in ("image", "tensor") or _matches(value, step.sig), step.sig.describe()
    sig = program.signatures["image"]
    batches = _pil_epoch(spec, shards)
    assert [len(b.origins) for b in batches] == [8, 8, 7]
    for b in batches:  # and the batches, stacked in the declared layout
        images = b.fields["image"]
        assert images.shape[0] == len(b.origins) and all(_matches(x, sig) for x in images)
        assert b.fields["label"].dtype == torch.int64


def test_host_ops_on_the_label_component(shards: list[str]) -> None:
    spec = {"pipeline": {"label": ["label"], "j": {"from": "label", "ops": ["json"]},
                         "raw": {"from": "label", "ops": ["bytes"]}},
            "outputs": {"label": "label", "j": "j", "raw": "raw"}, "batch": {"size": 8}}
    for b in _pil_epoch(spec, shards):
        assert b.fields["label"].tolist() == b.fields["j"] == [int(r) for r in b.fields["raw"]]


# --- the same sample assignment as the DALI path ---------------------------------------------

@pytest.mark.parametrize("rank,world,policy", [(0, 1, "pad"), (0, 3, "partial"), (2, 3, "drop")])
def test_same_batches_of_keys_as_the_dali_loader(small_spec: dict, shards: list[str], rank: int, world: int,
                                                 policy: str) -> None:
    loader = feedfast.DataLoader(small_spec, shards=shards, rank=rank, world_size=world, last_batch=policy, backend="dali",
                                 num_workers=2)
    dali = []
    for _ in loader:
        dali.append((list(loader.last_origins), loader.last_valid))
    pil = run_pil_epoch(loader.plan, loader.shards, loader.epoch_plan(0), rank=rank, world=world, batch_size=4,
                        workers=0, seed=loader.spec.seed, epoch=0, start=0)
    assert [(b.origins, b.valid) for b in pil] == dali and dali


def test_padding_repeats_the_ranks_last_sample_at_the_end_of_a_batch() -> None:
    ep = EpochPlan((0,), rank_samples=7, steps=4, batch_sizes=(2, 2, 2, 2), valid=(2, 2, 2, 1))
    assert [step_positions(s, 2, ep.rank_samples, ep.batch_sizes[s]) for s in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 6]]


def test_shuffled_epochs_every_sample_once_resumable_and_independent_of_workers(small_spec: dict,
                                                                                 shards: list[str]) -> None:
    small_spec["shuffle"] = {"buffer": 64, "shards": True}
    small_spec["batch"] = {"size": 4, "last_batch": "pad"}
    e0, e1 = _pil_epoch(small_spec, shards), _pil_epoch(small_spec, shards, epoch=1)
    for batches in (e0, e1):
        real = [k for b in batches for _, k in b.origins[: b.valid]]
        assert len(real) == len(set(real)) == 23
        assert batches[-1].origins[-1] == batches[-1].origins[-2]  # padding repeats the last sample
        assert torch.equal(batches[-1].fields["image"][-1], batches[-1].fields["image"][-2])
    assert _keys(e0) != _keys(e1)
    two = _pil_epoch(small_spec, shards, workers=2)
    resumed = _pil_epoch(small_spec, shards, start=4)
    for run, first in ((two, 0), (resumed, 4)):
        assert _keys(run) == _keys(e0)[first:]
        for a, b in zip(run, e0[first:]):
            assert all(torch.equal(a.fields[f], b.fields[f]) for f in ("image", "label"))


# --- the deterministic val pipeline: DALI vs PIL vs an independent reference -----------------

RESIZE, CROP = 40, 32


def _reference(jpeg: bytes) -> np.ndarray:
    """Resize(40) + CenterCrop(32) + Normalize as torchvision computes them, in PIL and NumPy.

    torchvision truncates the resized longer side (``int(40 * long / short)``) and places the
    crop at ``int(round((h - 32) / 2))``, Python's round-half-to-even.
    """
    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    w, h = img.size
    nw, nh = (RESIZE, int(RESIZE * h / w)) if w <= h else (int(RESIZE * w / h), RESIZE)
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - CROP) / 2.0)), int(round((nw - CROP) / 2.0))
    arr = np.asarray(img, dtype=np.float32)[top:top + CROP, left:left + CROP] / 255.0
    return ((arr - MEAN) / STD).transpose(2, 0, 1)


@pytest.fixture(scope="module")
def val_runs(shards: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One epoch of the val pipeline (resize 40, crop 32) through DALI and PIL, and the reference."""
    overrides = [f"pipeline.image[1].size={RESIZE}", f"pipeline.image[2].size={CROP}"]
    loader = feedfast.DataLoader(VAL, shards=shards, overrides=overrides, batch_size=8, placement="cpu", backend="dali",
                                 num_workers=2, cache_dir=tmp_path_factory.getbasetemp() / "ffcache")
    dali, keys = [], []
    for images, _ in loader:
        dali.append(images.clone())
        keys += [k for _, k in loader.last_origins]
    pil = run_pil_epoch(loader.plan, loader.shards, loader.epoch_plan(0), rank=0, world=1, batch_size=8, workers=0,
                        seed=0, epoch=0, start=0)
    jpegs = _jpegs(shards)
    return {"dali": torch.cat(dali), "pil": torch.cat([b.fields["image"] for b in pil]),
            "ref": torch.stack([torch.from_numpy(_reference(jpegs[k])) for k in keys])}


def _diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    err = (a - b).abs()
    return float(err.max()), float(err.mean())


def test_val_pil_backend_equals_the_reference(val_runs: dict[str, Any]) -> None:
    """Same decoder (libjpeg-turbo) and filter: measured max 0.0 normalized units."""
    assert val_runs["pil"].shape == (23, 3, CROP, CROP)
    assert _diff(val_runs["pil"], val_runs["ref"])[0] < 1e-4


def test_val_dali_agrees_with_the_reference_and_the_pil_backend(val_runs: dict[str, Any]) -> None:
    """DALI vs the torchvision reference and vs PIL, in normalized units (x / 255 - mean) / std.

    Decoded pixels are identical (both use libjpeg-turbo) and feedfast gives DALI
    torchvision's output sizes and crop offsets, so what remains is DALI's antialiased
    linear resize against PIL's bilinear filter. Measured (23 images, resize 40, crop 32):
    max 0.018, mean 0.0024 normalized units against both (0.018 is about one grey level
    of 255). Tolerance: max < 0.05, mean < 0.005.
    """
    for other in ("ref", "pil"):
        worst, mean = _diff(val_runs["dali"], val_runs[other])
        assert worst < 0.05 and mean < 0.005, (other, worst, mean)


# --- failures -------------------------------------------------------------------------------

def test_an_op_without_a_pil_form_fails_at_compile_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(OPS, "resize", dataclasses.replace(OPS["resize"], pil=None))
    spec = load_spec(VAL)
    with pytest.raises(BackendError, match=r"imagenet-val\.yaml: pipeline\.image\[1\]: op `resize` has no PIL form"):
        compile_pil(spec)
    nowhere = ShardSet(("/nonexistent.tar",), ("/nonexistent.idx",), (1,))
    ep = EpochPlan((0,), 1, 1, (1,), (1,))
    with pytest.raises(BackendError, match="resize"):  # before any shard is touched
        next(run_pil_epoch(build_plan(spec, device="cpu"), nowhere, ep, rank=0, world=1, batch_size=1, workers=0,
                           seed=0, epoch=0, start=0))


@pytest.mark.parametrize("kind,workers", [("garbage", 0), ("truncated", 0), ("truncated", 2)])
def test_a_corrupt_jpeg_raises_sample_error_naming_shard_and_key(tmp_path: Path, shards: list[str], kind: str,
                                                                  workers: int) -> None:
    good = next(iter(_jpegs(shards).values()))
    bad = b"not a jpeg at all" * 20 if kind == "garbage" else good[: len(good) // 3]
    path = shard_with_bad_sample(tmp_path, good, bad)
    index, samples = load_index(path, tmp_path)
    sset = ShardSet((path,), (str(index),), (len(samples),))  # unchecked, so the backend meets the bad image
    spec = load_spec(VAL).replace(batch_size=2)
    ep = plan_epoch([len(samples)], batch_size=2, rank=0, world=1, last_batch="partial")
    with pytest.raises(SampleError, match=r"sample 'bad'") as info:
        list(run_pil_epoch(build_plan(spec, device="cpu"), sset, ep, rank=0, world=1, batch_size=2,
                           workers=workers, seed=0, epoch=0, start=0))
    assert (info.value.shard, info.value.key) == (path, "bad")
    assert "`decode` failed (pipeline.image[0])" in info.value.reason


@pytest.mark.parametrize("workers", [0, 1])
def test_an_image_only_dali_decodes_is_delivered_with_dalis_pixels(tmp_path: Path, workers: int) -> None:
    good, grey = make_jpeg(0), np.asarray(Image.open(io.BytesIO(make_jpeg(5))).convert("L"))
    cases = {"stray": pillow_rejects_dali_decodes(1)[0], "lossless": lossless_jpeg(grey)}
    spec = load_spec({**SMALL_SPEC, "pipeline": {"image": ["decode", {"center_crop": {"size": [48, 64]}}],
                                                 "label": ["label"]}}).replace(batch_size=4)
    for key, bad in cases.items():
        (tmp_path / key).mkdir()
        path = shard_with_bad_sample(tmp_path / key, good, bad)
        index, samples = load_index(path, tmp_path)
        sset = ShardSet((path,), (str(index),), (len(samples),))  # unchecked: the backend itself meets the image
        ep = plan_epoch([len(samples)], batch_size=4, rank=0, world=1, last_batch="partial")
        (batch,) = run_pil_epoch(build_plan(spec, device="cpu"), sset, ep, rank=0, world=1, batch_size=4,
                                 workers=workers, seed=0, epoch=0, start=0)
        assert [k for _, k in batch.origins] == ["a", "b", "bad", "c"]
        pixels = batch.fields["image"][2].numpy()
        expected = DaliDecoder().decode(bad)[0] if key == "stray" else np.repeat(grey[:, :, None], 3, axis=2)
        assert np.array_equal(pixels, expected), key


def test_an_image_neither_decodes_raises_with_both_reasons(tmp_path: Path) -> None:
    path = shard_with_bad_sample(tmp_path, make_jpeg(0), make_jpeg(1)[:400])
    index, samples = load_index(path, tmp_path)
    sset = ShardSet((path,), (str(index),), (len(samples),))
    spec = load_spec(VAL).replace(batch_size=2)
    ep = plan_epoch([len(samples)], batch_size=2, rank=0, world=1, last_batch="partial")
    with pytest.raises(SampleError, match=r"sample 'bad'") as info:
        list(run_pil_epoch(build_plan(spec, device="cpu"), sset, ep, rank=0, world=1, batch_size=2, workers=0,
                           seed=0, epoch=0, start=0))
    assert "cannot decode the image (OSError" in info.value.reason and "; DALI: " in info.value.reason, info.value.reason


# --- through feedfast.DataLoader(backend="pil") ----------------------------------------------

def test_dataloader_pil_backend_matches_dali_samples_and_resumes(small_spec: dict, shards: list[str]) -> None:
    dali = feedfast.DataLoader(small_spec, shards=shards, num_workers=1, backend="dali")
    pil = feedfast.DataLoader(small_spec, shards=shards, backend="pil", num_workers=0)
    d_keys, p_batches = [], []
    for _ in dali:
        d_keys.append(list(dali.last_origins))
    for images, labels in pil:
        p_batches.append((images.clone(), labels.clone(), list(pil.last_origins)))
        assert images.shape[1:] == (3, 32, 32) and labels.dtype == torch.int64
    assert [b[2] for b in p_batches] == d_keys and len(pil) == len(dali)
    assert pil.stats()["delivered"] == 23
    again = feedfast.DataLoader(small_spec, shards=shards, backend="pil", num_workers=0)
    it = iter(again)
    next(it), next(it)
    state = again.state_dict()
    resumed = feedfast.DataLoader(small_spec, shards=shards, backend="pil", num_workers=0)
    resumed.load_state_dict(state)
    rest = [(x.clone(), list(resumed.last_origins)) for x, _ in resumed]
    assert [r[1] for r in rest] == [b[2] for b in p_batches[2:]]
    assert all(torch.equal(r[0], b[0]) for r, b in zip(rest, p_batches[2:]))
    with pytest.raises(feedfast.UserError, match="backend"):
        feedfast.DataLoader(small_spec, shards=shards, backend="opencv")
