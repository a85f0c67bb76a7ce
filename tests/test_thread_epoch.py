"""The threaded CPU path: the pil backend's samples, crops and errors, computed in threads."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from feedfast import _env
from feedfast.compile.build import build_plan
from feedfast.errors import SampleError
from feedfast.loader.backends.cpu import native, pil_fast, thread_sample
from feedfast.loader.backends.cpu.pil import run_pil_epoch
from feedfast.loader.backends.cpu.threads import fast_path_supported, run_thread_epoch
from feedfast.loader.batch import Batch
from feedfast.order.deal import plan_epoch
from feedfast.shards.index.tarindex import load_index
from feedfast.sources.dataset import ShardSet, open_shards
from feedfast.spec import load_spec
from tests.helpers import shard_with_bad_sample

ROOT = Path(__file__).resolve().parents[1]
TRAIN_UINT8 = ["decode", {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5, "vertical": 0.3}}]


def _spec(image_ops: list[Any], *, batch: int = 4, last_batch: str = "partial", shuffle: bool = False) -> Any:
    spec: dict[str, Any] = {"pipeline": {"image": image_ops, "label": ["label"]}, "outputs": ["image", "label"],
                            "batch": {"size": batch, "last_batch": last_batch}, "seed": 3}
    if shuffle:
        spec["shuffle"] = {"buffer": 64, "shards": True}
    return load_spec(spec)


def _run(spec: Any, shards: list[str], *, backend: str = "threads", rank: int = 0, world: int = 1, epoch: int = 0,
         start: int = 0, workers: int = 2, consumer: str = "cpu") -> list[Batch]:
    sset = open_shards(shards, spec, _env.cache_dir())
    ep = plan_epoch(list(sset.sizes), batch_size=spec.batch_size, rank=rank, world=world, last_batch=spec.last_batch,
                    seed=spec.seed, epoch=epoch, shuffle_shards=spec.shuffle_shards)
    plan = build_plan(spec, device="cpu", consumer=consumer)
    run = run_thread_epoch if backend == "threads" else run_pil_epoch
    return list(run(plan, sset, ep, rank=rank, world=world, batch_size=spec.batch_size,
                    workers=workers if backend == "threads" else 0, seed=spec.seed, epoch=epoch, start=start))


def _origins(batches: list[Batch]) -> list[tuple[list[tuple[str, str]], int]]:
    return [(b.origins, b.valid) for b in batches]


@pytest.fixture()
def no_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full-size decoding only: the threaded path must then give the pil backend's pixels."""
    monkeypatch.setattr(thread_sample, "_DRAFT_FACTORS", ())


# --- the same samples as the pil backend -------------------------------------------------------

@pytest.mark.parametrize("rank,world,policy,shuffle", [(0, 1, "pad", False), (1, 3, "partial", True),
                                                       (2, 3, "drop", False), (0, 2, "pad", True)])
def test_same_origins_valid_counts_and_labels_as_the_pil_backend(shards: list[str], rank: int, world: int,
                                                                 policy: str, shuffle: bool) -> None:
    spec = _spec(TRAIN_UINT8, last_batch=policy, shuffle=shuffle)
    threads = _run(spec, shards, rank=rank, world=world)
    pil = _run(spec, shards, backend="pil", rank=rank, world=world)
    assert _origins(threads) == _origins(pil) and threads
    for a, b in zip(threads, pil):
        assert torch.equal(a.fields["label"], b.fields["label"])
        assert a.fields["image"].shape == b.fields["image"].shape == (len(a.origins), 32, 32, 3)


def test_every_sample_exactly_once_per_epoch_across_two_ranks_with_padding_counted(shards: list[str]) -> None:
    spec = _spec(TRAIN_UINT8, last_batch="pad", shuffle=True)
    for epoch in (0, 1):
        real: list[str] = []
        valid = []
        for rank in (0, 1):
            batches = _run(spec, shards, rank=rank, world=2, epoch=epoch)
            assert [len(b.origins) for b in batches] == [4, 4, 4]  # 12 and 11 samples: equal steps
            valid.append([b.valid for b in batches])
            real += [k for b in batches for _, k in b.origins[: b.valid]]
            if valid[-1][-1] == 3:  # padding repeats the rank's last sample, pixels included
                last = batches[-1]
                assert last.origins[-1] == last.origins[-2]
                assert torch.equal(last.fields["image"][-1], last.fields["image"][-2])
        assert sorted(valid) == [[4, 4, 3], [4, 4, 4]]
        assert len(real) == len(set(real)) == 23


def test_resume_from_a_step_gives_the_rest_of_the_epoch_unchanged(shards: list[str]) -> None:
    spec = _spec(["decode", {"random_resized_crop": {"size": 32}}, "flip", "normalize"], shuffle=True)
    whole = _run(spec, shards)
    resumed = _run(spec, shards, start=3, workers=1)
    assert _origins(resumed) == _origins(whole)[3:]
    for a, b in zip(resumed, whole[3:]):
        assert torch.equal(a.fields["image"], b.fields["image"]) and torch.equal(a.fields["label"], b.fields["label"])


def test_an_abandoned_epoch_stops_its_threads(shards: list[str]) -> None:
    import threading

    spec = _spec(TRAIN_UINT8)
    sset = open_shards(shards, spec, _env.cache_dir())
    ep = plan_epoch(list(sset.sizes), batch_size=spec.batch_size, rank=0, world=1, last_batch=spec.last_batch)
    before = threading.active_count()
    batches = run_thread_epoch(build_plan(spec, device="cpu"), sset, ep, rank=0, world=1, batch_size=4, workers=2,
                               seed=0, epoch=0, prefetch_factor=3)
    next(batches)
    assert threading.active_count() > before
    batches.close()  # type: ignore[attr-defined]
    assert threading.active_count() == before


# --- pixels: the pil backend's, within stated tolerances --------------------------------------

def _max_mean(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    err = (a.float() - b.float()).abs()
    return float(err.max()), float(err.mean())


@pytest.mark.usefixtures("no_draft")
@pytest.mark.parametrize("ops", [
    TRAIN_UINT8,
    ["decode", {"random_resized_crop": {"size": [20, 28], "interpolation": "cubic"}}, "flip",
     {"normalize": {"dtype": "float16", "layout": "HWC"}}],
    [{"decode": {"color": "gray"}}, {"resize": {"size": [20, 28]}},
     {"normalize": {"mean": [0.5], "std": [0.25]}}],
    ["decode", {"center_crop": {"size": 48}}, {"resize": {"size": [40, 36]}}, "flip", "normalize"],
], ids=["rrc-flip-uint8", "rrc-cubic-fp16-hwc", "gray-resize", "crop-then-resize"])
def test_without_reduced_decoding_pixels_equal_the_pil_backend(shards: list[str], ops: list[Any]) -> None:
    """Same decoder, same boxes, same filter: identical (a crop before a resize is taken first)."""
    spec = _spec(ops)
    for a, b in zip(_run(spec, shards), _run(spec, shards, backend="pil")):
        assert a.fields["image"].dtype == b.fields["image"].dtype
        assert torch.equal(a.fields["image"], b.fields["image"])


@pytest.mark.usefixtures("no_draft")
def test_resize_then_center_crop_is_one_box_resize_within_one_grey_level(shards: list[str]) -> None:
    """imagenet-val's resize then crop become one ``resize(box=...)`` of the whole image.

    The filter reads the same pixels; only float rounding of the box differs. Measured on
    the fixture shards: max 1 grey level, mean under 0.01. Tolerance: max 1, mean 0.02.
    """
    spec = _spec(["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}])
    worst = [_max_mean(a.fields["image"], b.fields["image"])
             for a, b in zip(_run(spec, shards), _run(spec, shards, backend="pil"))]
    assert max(w[0] for w in worst) <= 1 and max(w[1] for w in worst) < 0.02


def test_reduced_size_decoding_stays_close_to_the_pil_backend(shards: list[str]) -> None:
    """With DCT-scaled decoding (the fixtures' 64 to 96 px images, 32 px crops: factor 2 often applies).

    The reduced image is libjpeg's 2x2 (or larger) DCT downscale, then the bilinear resize;
    the pil backend resizes the full image. Measured on the fixture shards (uint8 pixels):
    mean absolute difference 0.7 grey levels, 99th percentile 8, a few edge pixels up to
    28 on these tiny, sharp synthetic images. Tolerance: mean < 2.0, 99th percentile <= 16.
    """
    spec = _spec(["decode", {"random_resized_crop": {"size": 32}}])
    ours = torch.cat([b.fields["image"] for b in _run(spec, shards)]).float()
    pil = torch.cat([b.fields["image"] for b in _run(spec, shards, backend="pil")]).float()
    err = (ours - pil).abs()
    assert float(err.mean()) < 2.0 and float(err.quantile(0.99)) <= 16


def test_draft_factor_keeps_the_box_at_least_the_output_size() -> None:
    view = thread_sample.View(0, (0.0, 0.0, 1000.0, 600.0), (224, 224), (0, 0, 1000, 600), resample=2)
    assert thread_sample.draft_factor(view) == 2  # 600 / 2 = 300 >= 224, 600 / 4 = 150 < 224
    assert thread_sample.draft_factor(thread_sample.View(0, (0, 0, 4000, 3000), (224, 224), (0, 0, 4000, 3000),
                                                         resample=2)) == 8
    assert thread_sample.draft_factor(thread_sample.View(0, (0, 0, 400, 300), (224, 224), (0, 0, 400, 300),
                                                         resample=2)) == 1
    assert thread_sample.draft_factor(thread_sample.View(0, (0, 0, 900, 900), (224, 224), (0, 0, 900, 900))) == 1


def test_high_resolution_jpeg_decoded_at_reduced_size_matches_torchvision_crop(tmp_path: Path) -> None:
    """A 1600x1200 photo-like JPEG cropped to 224: factor 4 applies; pixels stay within tolerance.

    Measured against the pil backend's full decode + crop + resize (torchvision's
    RandomResizedCrop): mean absolute difference 1.6 grey levels, 99th percentile 6, max 12.
    Tolerance: mean < 2.5, 99th percentile <= 12.
    """
    from feedfast.write.synth import make_image

    buf = io.BytesIO()
    make_image(np.random.default_rng(5), 1600, 1200).save(buf, format="JPEG", quality=90)
    path = tmp_path / "big-0000.tar"
    with tarfile.open(path, "w") as tar:
        for key in ("a", "b", "c"):
            for ext, payload in (("jpg", buf.getvalue()), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    spec = _spec(["decode", {"random_resized_crop": {"size": 224, "scale": [0.5, 1.0]}}], batch=3)
    ours = _run(spec, [str(path)])[0].fields["image"]
    pil = _run(spec, [str(path)], backend="pil")[0].fields["image"]
    err = (ours.float() - pil.float()).abs()
    assert float(err.mean()) < 2.5 and float(err.quantile(0.99)) <= 12


# --- deferred normalize, the fallback, failures ------------------------------------------------

def test_normalize_deferred_to_a_cuda_consumer_yields_uint8_hwc(shards: list[str]) -> None:
    spec = load_spec(ROOT / "pipelines/imagenet-train.yaml").replace(batch_size=4)
    plan = build_plan(spec, device="cpu", consumer="cuda")
    assert plan.nodes[plan.outputs["image"]].deferred and fast_path_supported(plan)
    deferred = _run(spec, shards, consumer="cuda")
    normalized = _run(spec, shards)
    assert deferred[0].fields["image"].dtype == torch.uint8 and deferred[0].fields["image"].shape[1:] == (224, 224, 3)
    from feedfast.ops.color import normalize_tensor

    params = plan.nodes[plan.outputs["image"]].params
    for a, b in zip(deferred, normalized):
        assert torch.equal(normalize_tensor(a.fields["image"], params), b.fields["image"])


def test_a_spec_with_an_op_outside_the_fast_path_runs_the_pil_program_in_threads(shards: list[str]) -> None:
    spec = _spec(["decode", "color_jitter", {"random_resized_crop": {"size": 32}}, "flip", "normalize"])
    assert not fast_path_supported(build_plan(spec, device="cpu"))
    assert fast_path_supported(build_plan(_spec(TRAIN_UINT8), device="cpu"))
    for a, b in zip(_run(spec, shards), _run(spec, shards, backend="pil")):
        assert a.origins == b.origins and torch.equal(a.fields["image"], b.fields["image"])


def test_a_center_crop_that_pads_takes_the_pil_program_for_that_sample(shards: list[str]) -> None:
    spec = _spec(["decode", {"center_crop": {"size": [20, 140]}}])  # wider than every fixture image
    assert fast_path_supported(build_plan(spec, device="cpu"))
    for a, b in zip(_run(spec, shards), _run(spec, shards, backend="pil")):
        assert torch.equal(a.fields["image"], b.fields["image"])


def test_shipped_pipelines_that_take_the_fast_path() -> None:
    fast = {p.stem: fast_path_supported(build_plan(load_spec(p), device="cpu"))
            for p in sorted((ROOT / "pipelines").glob("*.yaml"))}
    assert fast == {"features-npy": True, "imagenet-train": True, "imagenet-train-fp16": True, "imagenet-train-recipe": True,
                    "imagenet-val": True, "ssl-twoview": False}


@pytest.mark.parametrize("kind", ["garbage", "truncated", "empty"])
def test_a_corrupt_jpeg_raises_sample_error_naming_shard_and_key(tmp_path: Path, kind: str) -> None:
    good_buf = io.BytesIO()
    Image.new("RGB", (80, 60), (120, 30, 200)).save(good_buf, format="JPEG")
    good = good_buf.getvalue()
    bad = {"garbage": b"not a jpeg at all" * 20, "truncated": good[: len(good) // 3], "empty": b""}[kind]
    path = shard_with_bad_sample(tmp_path, good, bad)
    index, samples = load_index(path, tmp_path)
    sset = ShardSet((path,), (str(index),), (len(samples),))  # unchecked, so the threads meet the bad image
    spec = _spec(["decode", {"random_resized_crop": {"size": 32}}, "normalize"], batch=2)
    ep = plan_epoch([len(samples)], batch_size=2, rank=0, world=1, last_batch="partial")
    with pytest.raises(SampleError, match=r"sample 'bad'") as info:
        list(run_thread_epoch(build_plan(spec, device="cpu"), sset, ep, rank=0, world=1, batch_size=2, workers=2,
                              seed=0, epoch=0))
    assert (info.value.shard, info.value.key) == (path, "bad")
    assert "`decode` failed (pipeline.image[0])" in info.value.reason


def test_decoding_only_the_rows_a_crop_reads_gives_the_same_rows() -> None:
    from feedfast.write.synth import make_image

    buf = io.BytesIO()
    make_image(np.random.default_rng(2), 300, 200).save(buf, format="JPEG", quality=90)
    jpeg = buf.getvalue()
    full = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    top = Image.open(io.BytesIO(jpeg))
    assert pil_fast.load_rows(top, 77)
    assert np.array_equal(np.asarray(top.convert("RGB"))[:77], full[:77])
    assert not np.asarray(top.convert("RGB"))[120:].any()  # rows below were never decoded
    cut = Image.open(io.BytesIO(jpeg[: len(jpeg) // 4]))  # the data ends above row 150
    assert not pil_fast.load_rows(cut, 150)


def test_rows_needed_covers_the_box_and_the_filter_reach() -> None:
    crop_first = thread_sample.View(0, (10.0, 20.0, 110.0, 120.0), (32, 32), (10, 20, 110, 120), resample=2)
    assert thread_sample.region_needed([crop_first], 1.0, (400, 400))[3] == 121  # clipped to the crop: its rows only
    resize_first = thread_sample.View(0, (0.0, 50.0, 300.0, 150.0), (60, 20), (0, 0, 300, 400), resample=2)
    assert thread_sample.region_needed([resize_first], 1.0, (400, 400))[3] == 150 + 16 + 1  # the filter reads 3 x 5 + 1 rows below
    assert thread_sample.region_needed([resize_first], 2.0, (200, 200))[3] == 84 + 1  # 75 + 3 x 2.5 + 1, rounded up


def test_batch_memory_is_reused_only_once_the_consumer_let_go_of_it(shards: list[str]) -> None:
    spec = _spec(["decode", {"random_resized_crop": {"size": 32}}, "normalize"])
    kept = _run(spec, shards)  # every batch held: none may be overwritten by a later one
    again = _run(spec, shards)
    assert all(torch.equal(a.fields["image"], b.fields["image"]) for a, b in zip(kept, again))
    assert len({b.fields["image"].data_ptr() for b in kept}) == len(kept)
    sset = open_shards(shards, spec, _env.cache_dir())
    ep = plan_epoch(list(sset.sizes), batch_size=4, rank=0, world=1, last_batch="partial")
    seen = set()
    for batch in run_thread_epoch(build_plan(spec, device="cpu"), sset, ep, rank=0, world=1, batch_size=4,
                                  workers=2, seed=0, epoch=0, prefetch_factor=1):
        seen.add(batch.fields["image"].data_ptr())
        del batch  # let go: its memory may come back
    assert len(seen) < ep.steps


@pytest.mark.parametrize("region", [True, False], ids=["region-decoder", "pillow-only"])
@pytest.mark.parametrize("draft", [False, True], ids=["full-decode", "reduced-decode"])
def test_pixels_against_torchvision_resized_crop_with_the_same_boxes(shards: list[str], monkeypatch: pytest.MonkeyPatch,
                                                                     draft: bool, region: bool) -> None:
    """torchvision's own ``F.resized_crop`` (bilinear) on each sample, at the box the sample's RNG draws.

    Full-size decoding: equal, pixel for pixel. Reduced-size decoding (the fixtures' small
    images, 32 px crops): the tolerance of the pil-backend test above (mean < 2.0 grey levels).
    """
    from feedfast.baseline.vision import transforms
    from feedfast.compile.pil import compile_pil
    from feedfast.errors import UserError
    from feedfast.ops.pil_ops import random_resized_crop_params
    from feedfast.order.draws import batch_draws
    from feedfast.order.orders import epoch_rows
    from feedfast.sources.members import ShardMembers

    try:
        functional = transforms().functional
    except UserError as exc:
        pytest.skip(str(exc))
    if not draft:
        monkeypatch.setattr(thread_sample, "_DRAFT_FACTORS", ())
    if not region:
        monkeypatch.setattr(native, "ext", None)
    spec = _spec(["decode", {"random_resized_crop": {"size": 32}}], batch=8)
    ours = torch.cat([b.fields["image"] for b in _run(spec, shards)])
    sset = open_shards(shards, spec, _env.cache_dir())
    ep = plan_epoch(list(sset.sizes), batch_size=8, rank=0, world=1, last_batch="partial")
    rows = epoch_rows(sset, compile_pil(spec).exts, ep, rank=0, world=1, shuffle=False, seed=spec.seed, epoch=0)
    where = rows.take(np.arange(len(rows)))
    members = ShardMembers(sset.paths)
    expected = []
    for i, rng in enumerate(batch_draws(seed=spec.seed, epoch=0, samples=where.samples)):
        img = Image.open(io.BytesIO(members.sample(where, i)[0])).convert("RGB")
        top, left, h, w = random_resized_crop_params(img.width, img.height, (0.08, 1.0), (3 / 4, 4 / 3), rng)
        crop = functional.resized_crop(img, top, left, h, w, [32, 32], functional.InterpolationMode.BILINEAR)
        expected.append(torch.from_numpy(np.asarray(crop).copy()))
    err = (ours.float() - torch.stack(expected).float()).abs()
    assert float(err.max()) == 0.0 if not draft else float(err.mean()) < 2.0


@pytest.mark.parametrize("ops", [["decode", {"random_resized_crop": {"size": 24}}, "flip", "normalize"],
                                 ["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}, "normalize"],
                                 [{"decode": {"color": "gray"}}, {"random_resized_crop": {"size": 16}}]])
def test_the_region_decoder_and_fused_normalize_change_no_pixel_and_no_float(shards: list[str], ops: list[Any],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if not native.built():
        pytest.skip("feedfast._native is not built here")
    spec = _spec(ops, shuffle=True)
    fast = _run(spec, shards)
    monkeypatch.setattr(native, "ext", None)
    assert all(torch.equal(a.fields["image"], b.fields["image"]) for a, b in zip(fast, _run(spec, shards)))


@pytest.mark.parametrize("ops", [["decode", {"random_resized_crop": {"size": 24}}, "flip"],
                                 ["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}],
                                 ["decode", {"center_crop": {"size": 48}}, {"resize": {"size": [20, 30]}}]])
def test_region_decoding_gives_pillows_pixels_on_many_sizes_and_scales(ops: list[Any],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes and crops that put the region at every edge, with and without DCT scaling: equal, pixel for pixel."""
    if not native.built():
        pytest.skip("feedfast._native is not built here")
    from feedfast.compile.pil import compile_pil
    from feedfast.write.synth import make_image

    program = compile_pil(_spec(ops))
    rng = np.random.default_rng(11)
    ext = native.ext
    for k in range(12):
        width, height = int(rng.integers(50, 700)), int(rng.integers(50, 700))
        buf = io.BytesIO()
        make_image(rng, width, height).save(buf, format="JPEG", quality=int(rng.integers(60, 96)),
                                            subsampling=int(rng.integers(0, 3)))
        raw = [buf.getvalue(), b"1"]
        outs = []
        for module in (ext, None):
            monkeypatch.setattr(native, "ext", module)
            try:
                outs.append(thread_sample.fast_values(program, raw, random.Random(k))["image"])
            except thread_sample.NeedsFallback:  # a center crop larger than the image: the PIL program's
                outs.append(None)
        assert (outs[0] is None and outs[1] is None) or np.array_equal(outs[0], outs[1]), (width, height)


def test_a_spec_without_images_features_npy_gives_the_pil_backends_batches(tmp_path: Path) -> None:
    path = tmp_path / "features-0000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(7):
            buf = io.BytesIO()
            np.save(buf, np.arange(5, dtype=np.float32) * i)
            for ext, payload in (("npy", buf.getvalue()), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    spec = load_spec(ROOT / "pipelines/features-npy.yaml").replace(batch_size=3)
    assert fast_path_supported(build_plan(spec, device="cpu"))
    ours, pil = _run(spec, [str(path)]), _run(spec, [str(path)], backend="pil")
    assert _origins(ours) == _origins(pil) and len(ours) == 3
    for a, b in zip(ours, pil):
        assert torch.equal(a.fields["features"], b.fields["features"]) and torch.equal(a.fields["label"], b.fields["label"])


@pytest.mark.usefixtures("no_draft")
def test_two_views_of_one_decode_equal_the_pil_backend(shards: list[str]) -> None:
    view = {"from": "image", "ops": ["decode", {"random_resized_crop": {"size": 24}}, "flip", "normalize"]}
    spec = load_spec({"source": {"components": {"image": {"ext": "jpg", "kind": "image"}}},
                      "pipeline": {"a": view, "b": view}, "outputs": {"a": "a", "b": "b"}, "batch": {"size": 4}})
    assert fast_path_supported(build_plan(spec, device="cpu"))
    for x, y in zip(_run(spec, shards), _run(spec, shards, backend="pil")):
        assert torch.equal(x.fields["a"], y.fields["a"]) and torch.equal(x.fields["b"], y.fields["b"])
        assert not torch.equal(x.fields["a"], x.fields["b"])  # two draws, one decode


@pytest.mark.parametrize("backend", ["threads", "pil", "dali"])
def test_a_16_bit_image_keeps_its_values_on_every_backend(tmp_path: Path, backend: str) -> None:
    """A 16-bit grey gradient of mean 0.5 arrives at about 0.5 (it came out at 0.998 when clipped to 8 bits)."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    import feedfast

    ramp = np.tile(np.linspace(0, 65535, 64, dtype=np.uint16), (64, 1))
    buf = io.BytesIO()
    Image.fromarray(ramp).save(buf, format="PNG")
    shard = tmp_path / "deep.tar"
    with tarfile.open(shard, "w") as tar:
        for i in range(4):
            for ext, data in (("png", buf.getvalue()), ("cls", b"1")):
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    spec = {"version": 1, "name": "deep",
            "source": {"components": {"image": {"ext": "png", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}}},
            "pipeline": {"image": ["decode", {"resize": {"size": [32, 32]}},
                                   {"normalize": {"mean": [0, 0, 0], "std": [1, 1, 1]}}],
                         "label": ["label"]},
            "outputs": ["image", "label"], "batch": {"size": 4}}
    images, _ = next(iter(feedfast.DataLoader(spec, shards=str(shard), backend=backend, num_workers=1)))
    assert abs(float(images.mean()) - 0.5) < 0.03, float(images.mean())
