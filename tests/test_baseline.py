"""Tests for feedfast.baseline: the PIL ops of the pil backend, and the torchvision and DALI baselines."""

from __future__ import annotations

import copy
import io
import pathlib
import random
import sys
import tarfile
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from feedfast.baseline import IMAGENET_MEAN, IMAGENET_STD, TorchRecipe, make_torch_loader
from feedfast.baseline.dali_recipe import DaliRecipeLoader, ascii_labels
from feedfast.baseline.from_spec import settings_from_spec
from feedfast.baseline.rounds import ratio_spread, round_order
from feedfast.baseline.shard_dataset import ShardSamples
from feedfast.baseline.vision import transforms
from feedfast.errors import UserError
from feedfast.ops import pil_ops
from feedfast.shards.index.tarindex import load_index
from feedfast.write.synth import synth_shards
from tests.helpers import SMALL_SPEC, needs

TINY = {"min_side": 40, "max_side": 64, "num_classes": 10**9}


def _image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def _members_in(paths: list[pathlib.Path], ext: str) -> list[bytes]:
    """The bytes of every ``.ext`` member of the shards, in shard and tar order."""
    out = []
    for path in paths:
        with tarfile.open(path) as tar:
            for info in tar.getmembers():
                if info.name.endswith("." + ext):
                    handle = tar.extractfile(info)
                    assert handle is not None
                    out.append(handle.read())
    return out


def _labels_in(paths: list[pathlib.Path]) -> list[int]:
    return [int(raw) for raw in _members_in(paths, "cls")]


def _images_in(paths: list[pathlib.Path]) -> list[Image.Image]:
    images = []
    for raw in _members_in(paths, "jpg"):
        with Image.open(io.BytesIO(raw)) as img:
            images.append(img.convert("RGB"))
    return images


# --- pil_ops ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, database=None)
@given(
    w=st.integers(1, 40), h=st.integers(1, 40), tw=st.integers(1, 48), th=st.integers(1, 48)
)
def test_center_crop_matches_numpy(w: int, h: int, tw: int, th: int) -> None:
    arr = np.arange(h * w * 3, dtype=np.uint32).reshape(h, w, 3) % 251 + 1
    img = Image.fromarray(arr.astype(np.uint8), "RGB")
    # Independent model of torchvision: zero-pad (floor half before), then round-half-even offsets.
    pad_t, pad_l = max(th - h, 0) // 2, max(tw - w, 0) // 2
    canvas = np.zeros((max(h, th), max(w, tw), 3), dtype=np.uint8)
    canvas[pad_t : pad_t + h, pad_l : pad_l + w] = arr
    top = int(np.round((canvas.shape[0] - th) / 2.0))
    left = int(np.round((canvas.shape[1] - tw) / 2.0))
    expected = canvas[top : top + th, left : left + tw]
    got = np.asarray(pil_ops.center_crop(img, (th, tw)))
    assert got.shape == (th, tw, 3)
    np.testing.assert_array_equal(got, expected)


def test_center_crop_rounds_half_to_even_like_torchvision() -> None:
    arr = np.arange(7, dtype=np.uint8)[None, :].repeat(2, axis=0)
    img = Image.fromarray(arr, "L")
    # (7 - 4) / 2 = 1.5 -> round() gives 2; (7 - 2) / 2 = 2.5 -> 2.
    assert np.asarray(pil_ops.center_crop(img, (2, 4)))[0].tolist() == [2, 3, 4, 5]
    assert np.asarray(pil_ops.center_crop(img, (2, 2)))[0].tolist() == [2, 3]


@pytest.mark.parametrize(
    "size_in,size_out",
    [
        ((500, 375), (341, 256)),
        ((375, 500), (256, 341)),
        ((300, 300), (256, 256)),
        ((257, 1000), (256, 996)),
    ],
)
def test_resize_shorter_torchvision_rule(
    size_in: tuple[int, int], size_out: tuple[int, int]
) -> None:
    assert pil_ops.resize_shorter(_image(*size_in), 256).size == size_out


def test_resize_shorter_same_size_is_noop() -> None:
    img = _image(256, 300)
    assert pil_ops.resize_shorter(img, 256) is img


def _fallback(width: int, height: int, ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    in_ratio = width / height
    w, h = width, height
    if in_ratio < ratio[0]:
        h = max(1, int(round(width / ratio[0])))
    elif in_ratio > ratio[1]:
        w = max(1, int(round(height * ratio[1])))
    return (height - h) // 2, (width - w) // 2, h, w


@settings(max_examples=200, deadline=None, database=None)
@given(
    width=st.integers(1, 2000),
    height=st.integers(1, 2000),
    scale=st.tuples(st.floats(0.01, 1.0), st.floats(0.01, 1.0)).map(sorted),
    ratio=st.tuples(st.floats(0.2, 5.0), st.floats(0.2, 5.0)).map(sorted),
    seed=st.integers(0, 2**32),
)
def test_random_resized_crop_params_inside_and_in_bounds(
    width: int, height: int, scale: list[float], ratio: list[float], seed: int
) -> None:
    rng = random.Random(seed)
    top, left, h, w = pil_ops.random_resized_crop_params(width, height, scale, ratio, rng)
    assert 0 <= top and 0 <= left and 1 <= h and 1 <= w
    assert top + h <= height and left + w <= width
    if (top, left, h, w) == _fallback(width, height, (ratio[0], ratio[1])):
        return
    # w = round(sqrt(A * r)), h = round(sqrt(A / r)): undo the rounding as intervals.
    area = width * height
    assert (w - 0.5) * (h - 0.5) <= scale[1] * area * (1 + 1e-9)
    assert (w + 0.5) * (h + 0.5) >= scale[0] * area * (1 - 1e-9)
    assert (w - 0.5) / (h + 0.5) <= ratio[1] * (1 + 1e-9)
    assert (w + 0.5) / max(h - 0.5, 1e-9) >= ratio[0] * (1 - 1e-9)


def test_random_resized_crop_params_central_fallback() -> None:
    # Every attempt needs h >= ~24 > 10, so torchvision falls back to a central 4/3 crop.
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    params = pil_ops.random_resized_crop_params(1000, 10, scale, ratio, random.Random(0))
    assert params == (0, 493, 10, 13)
    params = pil_ops.random_resized_crop_params(10, 1000, scale, ratio, random.Random(0))
    assert params == (493, 0, 13, 10)


@pytest.mark.parametrize(
    "scale,ratio", [((0.5, 0.1), (0.75, 1.33)), ((0.1, 1.0), (0.0, 1.0)), ((0.1,), (1, 1))]
)
def test_random_resized_crop_params_rejects_bad_ranges(scale: tuple, ratio: tuple) -> None:
    with pytest.raises(UserError, match="must be a pair"):
        pil_ops.random_resized_crop_params(10, 10, scale, ratio, random.Random(0))


def test_random_resized_crop_size_and_determinism() -> None:
    img = _image(120, 90)
    a = pil_ops.random_resized_crop(img, 32, rng=random.Random(7))
    b = pil_ops.random_resized_crop(img, 32, rng=random.Random(7))
    assert a.size == (32, 32) and a.tobytes() == b.tobytes()
    assert pil_ops.random_resized_crop(img, (20, 30), rng=random.Random(7)).size == (30, 20)


def test_hflip_and_to_tensor_match_numpy() -> None:
    img = _image(13, 9)
    arr = np.asarray(img)
    np.testing.assert_array_equal(np.asarray(pil_ops.hflip(img)), arr[:, ::-1])
    t = pil_ops.to_tensor(img)
    assert t.dtype == torch.float32 and t.shape == (3, 9, 13) and t.is_contiguous()
    np.testing.assert_allclose(t.numpy(), arr.transpose(2, 0, 1) / 255.0, rtol=1e-6)
    assert pil_ops.to_tensor(img.convert("L")).shape == (1, 9, 13)
    with pytest.raises(UserError, match="8-bit"):
        pil_ops.to_tensor(img.convert("F"))


def test_normalize_in_place() -> None:
    t = torch.rand(2, 3, 4, 5)
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    expected = (t - mean) / std
    out = pil_ops.normalize(t, IMAGENET_MEAN, IMAGENET_STD)
    assert out is t
    torch.testing.assert_close(t, expected)
    with pytest.raises(UserError, match="non-zero"):
        pil_ops.normalize(torch.rand(3, 2, 2), (0, 0, 0), (1, 0, 1))
    with pytest.raises(UserError, match="3 values"):
        pil_ops.normalize(torch.rand(3, 2, 2), (0, 0), (1, 1))


# --- the torchvision baseline ----------------------------------------------------------------


@needs("torchvision")
def test_recipe_is_torchvisions_own_transforms() -> None:
    tv = transforms()
    train = TorchRecipe(size=32).compose().transforms
    assert [type(t) for t in train] == [tv.RandomResizedCrop, tv.RandomHorizontalFlip, tv.PILToTensor,
                                        tv.ConvertImageDtype, tv.Normalize]
    assert all(type(t).__module__.startswith("torchvision.") for t in train)
    assert TorchRecipe().describe()[0].startswith("RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0)")
    assert TorchRecipe(flip_p=0.0).describe()[1] == "PILToTensor()"  # no flip, as the reference recipe
    val = TorchRecipe(train=False).describe()
    assert val[0].startswith("Resize(size=256") and val[1] == "CenterCrop(size=(224, 224))"
    recipe = TorchRecipe(size=176, trivial_augment=True, random_erasing=0.1).compose().transforms  # the v2 recipe
    assert [type(t) for t in recipe] == [tv.RandomResizedCrop, tv.RandomHorizontalFlip, tv.TrivialAugmentWide,
                                         tv.PILToTensor, tv.ConvertImageDtype, tv.Normalize, tv.RandomErasing]
    assert recipe[2].interpolation == tv.InterpolationMode.BILINEAR and recipe[-1].p == 0.1
    for bad in ({"size": 0}, {"flip_p": 1.5}, {"scale": (0.9, 0.1)}, {"std": (1.0, 0.0, 1.0)}):
        with pytest.raises(UserError, match="got"):
            TorchRecipe(**bad)  # type: ignore[arg-type]


def test_missing_torchvision_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(UserError, match=r"pip install 'feedfast\[compare\]'"):
        transforms()


def test_a_torchvision_built_for_another_torch_says_which_release_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    class Mismatched(types.ModuleType):  # what PyPI's torchvision raises beside a +cpu torch wheel, on import
        def __getattr__(self, name: str) -> None:
            raise RuntimeError("operator torchvision::nms does not exist")

    monkeypatch.setitem(sys.modules, "torchvision", Mismatched("torchvision"))
    with pytest.raises(UserError, match=r"torchvision::nms does not exist.*torchvision 0\.\(N\+15\)\.P"):
        transforms()


@pytest.fixture(scope="module")
def shard_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[pathlib.Path]]:
    """Tiny shard sets with 1 and 3 shards (fewer and more than 2 workers)."""
    root = tmp_path_factory.mktemp("baseline")
    return {
        1: synth_shards(root / "one", samples=7, per_shard=7, seed=1, **TINY),
        3: synth_shards(root / "three", samples=11, per_shard=4, seed=3, **TINY),
    }


@needs("torchvision")
@pytest.mark.parametrize("num_shards", [1, 3])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("train", [True, False])
def test_every_sample_exactly_once_in_full_batches(
    shard_sets: dict[int, list[pathlib.Path]], num_shards: int, num_workers: int, train: bool
) -> None:
    paths = shard_sets[num_shards]
    loader = make_torch_loader([str(p) for p in paths], batch_size=3, num_workers=num_workers, train=train,
                               size=24, resize=28)
    assert loader.persistent_workers is (num_workers > 0)
    delivered, sizes = [], []
    for images, labels in loader:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 24, 24)
        assert labels.dtype == torch.int64 and labels.shape == (images.shape[0],)
        delivered += labels.tolist()
        sizes.append(images.shape[0])
    expected = _labels_in(paths)
    assert len(set(expected)) == len(expected)  # labels identify samples (num_classes = 1e9)
    assert delivered == expected  # in shard order: no shuffle
    assert sizes == [3] * (len(expected) // 3) + ([len(expected) % 3] if len(expected) % 3 else [])


@needs("torchvision")
def test_train_batches_equal_torchvision_applied_directly(shard_sets: dict[int, list[pathlib.Path]]) -> None:
    """In-process, the baseline's crops and flips are torchvision's draws from a generator seeded with ``seed``.

    feedfast's own re-implementation (pil_ops, random.Random) draws other crops: the negative
    control at the end shows that this test tells the two apart.
    """
    paths, recipe = shard_sets[3], TorchRecipe(size=24)
    loader = make_torch_loader(paths, batch_size=4, num_workers=0, size=24, seed=5)
    got = torch.cat([images for images, _ in loader])
    compose, images = recipe.compose(), _images_in(paths)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        expected = torch.stack([compose(img) for img in images])
    assert torch.equal(got, expected)
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    rng = random.Random(5)
    ours = torch.stack([(pil_ops.to_tensor(pil_ops.random_resized_crop(img, 24, rng=rng)) - mean) / std
                        for img in images])
    assert not torch.allclose(ours, expected, atol=0.1)


@needs("torchvision")
def test_val_batches_equal_torchvision_in_workers(shard_sets: dict[int, list[pathlib.Path]]) -> None:
    paths = shard_sets[3]
    loader = make_torch_loader(paths, batch_size=4, num_workers=2, train=False, size=24, resize=28)
    got = torch.cat([images for images, _ in loader])
    compose = TorchRecipe(train=False, size=24, resize=28).compose()
    expected = torch.stack([compose(img) for img in _images_in(paths)])
    assert torch.equal(got, expected)
    per_channel = got.transpose(0, 1).reshape(3, -1)
    low = (0 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    assert torch.all(per_channel.min(dim=1).values >= low - 1e-5) and per_channel.std() > 0.1


@needs("torchvision")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_train_augmentation_reproducible_for_seed(shard_sets: dict[int, list[pathlib.Path]], num_workers: int) -> None:
    def run(seed: int) -> torch.Tensor:
        loader = make_torch_loader(shard_sets[3], batch_size=4, num_workers=num_workers, size=16, seed=seed)
        return torch.cat([images for images, _ in loader])

    first = run(0)
    assert torch.equal(first, run(0))
    assert not torch.equal(first, run(1))


@needs("torchvision")
def test_in_process_loader_leaves_the_global_rng_alone(shard_sets: dict[int, list[pathlib.Path]]) -> None:
    loader = make_torch_loader(shard_sets[1], batch_size=4, num_workers=0, size=16)
    torch.manual_seed(9)
    expected = torch.rand(3)
    torch.manual_seed(9)
    for _ in loader:
        pass
    assert torch.equal(torch.rand(3), expected)


@needs("torchvision")
def test_persistent_workers_serve_every_epoch(shard_sets: dict[int, list[pathlib.Path]]) -> None:
    loader = make_torch_loader(shard_sets[3], batch_size=4, num_workers=2, size=16, shuffle=True)
    epochs = [sorted(int(v) for _, labels in loader for v in labels) for _ in range(2)]
    workers = loader._iterator._workers  # torch's persistent iterator: the same worker processes
    assert epochs[0] == epochs[1] == sorted(_labels_in(shard_sets[3]))
    for _ in loader:
        pass
    assert loader._iterator._workers is workers


def test_dataset_reads_given_indexes_and_counts_incomplete_samples(
    shard_sets: dict[int, list[pathlib.Path]], tmp_path: pathlib.Path
) -> None:
    shard = str(shard_sets[1][0])
    _, samples = load_index(shard, tmp_path)
    index = tmp_path / "two.idx"
    first, second = samples[0], samples[1]
    lines = [f"{m.ext} {m.offset} {m.size} {m.name}" for m in first.members]
    index.write_text("v1.2 2\n" + " ".join(lines) + "\n" + " ".join(
        f"{m.ext} {m.offset} {m.size} {m.name}" for m in second.members if m.ext == "cls") + "\n")
    with pytest.warns(RuntimeWarning, match="1 sample"):
        dataset = ShardSamples([shard], [str(index)], image_exts=frozenset({"jpg"}), label_ext="cls",
                               transform=lambda img: img.size)
    assert len(dataset) == 1 and dataset.missing == [(shard, second.key)]
    assert dataset[0][1] == _labels_in(shard_sets[1])[0]


@pytest.mark.parametrize(
    "override,name",
    [({"shards": []}, "shards"), ({"shards": "a.tar"}, "shards"), ({"batch_size": 0}, "batch_size"),
     ({"num_workers": -1}, "num_workers"), ({"size": 0}, "size"), ({"seed": -2}, "seed"),
     pytest.param({"shards": ["/nope/a.tar"]}, "local tar files", marks=needs("torchvision"))],
)
def test_make_torch_loader_rejects_bad_arguments(override: dict, name: str) -> None:
    args = {"shards": ["a.tar"], "batch_size": 2, "num_workers": 0, **override}
    shards = args.pop("shards")
    with pytest.raises(UserError, match=name):
        make_torch_loader(shards, **args)


# --- the DALI baseline and the spec's settings ------------------------------------------------


def test_ascii_labels() -> None:
    raw = torch.tensor([[ord("4"), ord("2"), 10, 0], [ord("7"), 0, 0, 0], [0, 0, 0, 0]], dtype=torch.uint8)
    assert ascii_labels(raw).tolist() == [42, 7, 0]


@pytest.mark.parametrize("train", [True, False])
def test_dali_baseline_delivers_every_sample_once(shard_sets: dict[int, list[pathlib.Path]], tmp_path: pathlib.Path,
                                                  train: bool) -> None:
    paths = [str(p) for p in shard_sets[3]]
    indexes = [str(load_index(p, tmp_path)[0]) for p in paths]
    loader = DaliRecipeLoader(paths, indexes, recipe=TorchRecipe(train=train, size=24, resize=28), batch_size=4,
                              threads=1, device_id=None)
    for _ in range(2):  # epoch after epoch
        labels, sizes = [], []
        for images, batch_labels in loader:
            assert images.dtype == torch.float32 and images.shape[1:] == (3, 24, 24)
            labels += batch_labels.tolist()
            sizes.append(images.shape[0])
        assert labels == _labels_in(shard_sets[3]) and sizes == [4, 4, 3]


def test_settings_from_spec() -> None:
    from feedfast.cli.common import find_spec
    from feedfast.spec import load_spec

    train = settings_from_spec(load_spec(find_spec("imagenet-train")))
    assert train.recipe == TorchRecipe(train=True, size=224, scale=(0.08, 1.0), ratio=(0.75, 1.3333333), flip_p=0.5)
    assert (train.image_ext, train.label_ext, train.shuffle, train.seed) == ("jpg;jpeg;png", "cls", True, 0)
    val = settings_from_spec(load_spec(find_spec("imagenet-val")))
    assert val.recipe == TorchRecipe(train=False, size=224, resize=256) and not val.shuffle
    spec = copy.deepcopy(SMALL_SPEC)
    spec["pipeline"]["image"] = ["decode", {"resize": {"size": [32, 32]}}, "normalize"]
    with pytest.raises(UserError, match="--compare needs"):
        settings_from_spec(load_spec(spec))


@needs("torchvision")
def test_settings_from_a_recipe_spec_run_its_augmentations_and_mix() -> None:
    """`feedfast bench imagenet-train-recipe --compare torch` runs torchvision's TrivialAugmentWide, RandomErasing and
    the reference's MixUp/CutMix collate, not the plain crop; ops the baseline has no form for are named."""
    from feedfast.cli.common import find_spec
    from feedfast.spec import load_spec

    recipe = settings_from_spec(load_spec(find_spec("imagenet-train-recipe")))
    assert recipe.recipe.trivial_augment and recipe.recipe.random_erasing == 0.1 and recipe.recipe.size == 176
    assert recipe.mix is not None and (recipe.mix.mixup_alpha, recipe.mix.cutmix) == (0.2, 1.0)
    assert recipe.left_out == ()
    names = [type(t).__name__ for t in recipe.recipe.compose().transforms]
    assert "TrivialAugmentWide" in names and names[-1] == "RandomErasing"
    spec = copy.deepcopy(SMALL_SPEC)
    spec["pipeline"]["image"] = ["decode", {"random_resized_crop": {"size": 32}}, {"rand_augment": {}}, "normalize"]
    other = settings_from_spec(load_spec(spec))
    assert other.left_out == ("rand_augment",) and not other.recipe.trivial_augment and other.mix is None


# --- alternating rounds ---------------------------------------------------------------------


def test_round_order_alternates() -> None:
    assert round_order(["feedfast", "torch"], 4) == [("feedfast", "torch"), ("torch", "feedfast"),
                                                     ("feedfast", "torch"), ("torch", "feedfast")]
    assert round_order(["feedfast"], 2) == [("feedfast",), ("feedfast",)]
    with pytest.raises(ValueError):
        round_order(["a"], 0)


def test_ratio_spread_is_the_median_of_per_round_ratios() -> None:
    spread = ratio_spread([300.0, 200.0, 100.0, 400.0], [100.0, 100.0, 100.0, 100.0])
    assert spread.ratios == (3.0, 2.0, 1.0, 4.0)
    assert (spread.median, spread.low, spread.high, spread.q1, spread.q3) == (2.5, 1.0, 4.0, 1.75, 3.25)
    assert spread.text() == "2.50x (min 1.00, max 4.00; IQR 1.75-3.25; 4 rounds)"
    assert spread.to_dict()["ratios"] == [3.0, 2.0, 1.0, 4.0]
    assert ratio_spread([2.0], [1.0]).text() == "2.00x (min 2.00, max 2.00; IQR 2.00-2.00; 1 round)"
    with pytest.raises(ValueError):
        ratio_spread([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        ratio_spread([1.0], [0.0])


@needs("torchvision")
def test_the_reference_batch_mix_collate_gives_soft_targets_in_workers(tmp_path: pathlib.Path) -> None:
    """torchvision's reference collate under --mixup-alpha 0.2 --cutmix-alpha 1.0, as the recipe row runs it."""
    from feedfast.baseline.torch_recipe import MixupCutmixCollate

    paths = synth_shards(tmp_path, samples=11, per_shard=4, seed=3, **{**TINY, "num_classes": 10})
    plain = make_torch_loader(paths, batch_size=4, num_workers=0, train=False, size=24, resize=28)
    mixed = make_torch_loader(paths, batch_size=4, num_workers=2, train=False, size=24, resize=28,
                              mixup_cutmix=MixupCutmixCollate(0.2, 1.0, num_classes=10))
    batches = list(zip(plain, mixed))
    assert batches
    for (x, y), (mx, my) in batches:
        assert mx.shape == x.shape and my.shape == (len(y), 10) and my.dtype == torch.float32
        assert torch.allclose(my.sum(dim=1), torch.ones(len(y)))
        assert torch.all((my > 0).sum(dim=1) <= 2)  # a sample's own label and its partner's
