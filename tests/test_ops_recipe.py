"""The recipe ops against torchvision's and timm's own implementations, and on every backend.

Distributions are compared with two-sample tests at a stated tolerance: Pearson's chi-square
on counts (op choice, magnitude bins) and Kolmogorov-Smirnov on continuous values (timm's noisy
levels, erased areas and aspect ratios), each at significance 0.001 with fixed seeds, so a
correct implementation fails once in a thousand seeds and a wrong distribution (another op
set, bin range or sign rule) fails at the sample sizes here. Pixels of each sub-op are compared
with torchvision's (or timm's) functional op for the same magnitude: equal, value for value.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from feedfast.ops import autoaug, autoaug_arrays, recipe
from feedfast.order.draws import batch_draws
from tests.corpus import photo

tv_autoaugment = pytest.importorskip("torchvision.transforms.autoaugment")
from torchvision.transforms import InterpolationMode  # noqa: E402

_Z_001 = 3.090  # the standard normal's 0.999 quantile
_KS_001 = 1.949  # Kolmogorov's c(alpha) at alpha = 0.001


def chi2_critical(dof: int) -> float:
    """The chi-square 0.999 quantile (Wilson-Hilferty; within 1% for dof >= 3)."""
    return dof * (1 - 2 / (9 * dof) + _Z_001 * math.sqrt(2 / (9 * dof))) ** 3


def chi2_two_sample(a: Counter, b: Counter) -> tuple[float, int]:
    """Pearson's statistic of the 2 x k table of two samples' counts, and its degrees of freedom."""
    keys = sorted(set(a) | set(b), key=repr)
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for k in keys:
        total = a[k] + b[k]
        for count, n in ((a[k], na), (b[k], nb)):
            expected = total * n / (na + nb)
            stat += (count - expected) ** 2 / expected
    return stat, len(keys) - 1


def assert_same_counts(a: Counter, b: Counter) -> None:
    stat, dof = chi2_two_sample(a, b)
    assert dof >= 1 and stat < chi2_critical(max(dof, 3)), (stat, dof, a, b)


def assert_same_distribution(a: list[float], b: list[float]) -> None:
    xs, ys = np.sort(a), np.sort(b)
    grid = np.concatenate([xs, ys])
    d = np.max(np.abs(np.searchsorted(xs, grid, side="right") / len(xs) - np.searchsorted(ys, grid, side="right") / len(ys)))
    n, m = len(xs), len(ys)
    assert d < _KS_001 * math.sqrt((n + m) / (n * m)), d


def _draws(n: int, seed: int = 0) -> list[Any]:
    return [d.stream(7) for d in batch_draws(seed=seed, epoch=0, samples=np.arange(n))]


def _photo(seed: int = 1, w: int = 64, h: int = 48) -> Image.Image:
    return photo(seed, w, h).convert("RGB")


# --- tables -------------------------------------------------------------------------------------

def test_the_magnitude_tables_are_torchvision_s() -> None:
    def as_lists(space: dict[str, Any]) -> dict[str, tuple[list[float], bool]]:
        return {k: ([float(x) for x in m.reshape(-1).tolist()] if m.ndim else [], s) for k, (m, s) in space.items()}

    wide = as_lists(tv_autoaugment.TrivialAugmentWide()._augmentation_space(31))
    ours = autoaug.torchvision_space(31, 1, 1, wide=True)
    assert list(wide) == list(autoaug.TORCHVISION_WIDE)
    assert all(ours[k] == wide[k] for k in wide)
    rand = as_lists(tv_autoaugment.RandAugment()._augmentation_space(31, (176, 200)))
    ours = autoaug.torchvision_space(31, 176, 200, wide=False)
    assert list(rand) == list(autoaug.TORCHVISION_WIDE) and all(ours[k] == rand[k] for k in rand)
    auto = tv_autoaugment.AutoAugment()
    assert tuple(tuple(p) for p in auto.policies) == autoaug.IMAGENET_POLICY
    space = as_lists(auto._augmentation_space(10, (50, 60)))
    ours = autoaug.torchvision_space(10, 50, 60, wide=False)
    assert all(ours[k] == space[k] for k in space)


# --- pixels of each sub-op ------------------------------------------------------------------------

@pytest.mark.parametrize("interp", [InterpolationMode.NEAREST, InterpolationMode.BILINEAR])
@pytest.mark.parametrize("fill", [None, [10, 200, 30]])
def test_each_sub_op_s_pixels_are_torchvision_s(interp: InterpolationMode, fill: list[int] | None) -> None:
    from torchvision.transforms.functional import pil_modes_mapping

    img = _photo()
    space = autoaug.torchvision_space(31, img.height, img.width, wide=True)
    for op in [*autoaug.TORCHVISION_WIDE, "Invert"]:
        magnitudes = space[op][0] or [0.0]
        for m in {magnitudes[0], magnitudes[len(magnitudes) // 2], magnitudes[-1]}:
            for value in ([m, -m] if space[op][1] else [m]):
                want = tv_autoaugment._apply_op(img, op, value, interpolation=interp, fill=fill)
                choice = autoaug.Choice(op, value, int(pil_modes_mapping[interp]))
                got = autoaug.apply(img, [choice], fill or (0,))
                assert np.array_equal(np.asarray(got), np.asarray(want)), (op, value)


def _timm() -> Any:
    """timm's auto_augment module (timm is in the ``test`` extra)."""
    import timm.data.auto_augment

    return timm.data.auto_augment


def test_each_timm_sub_op_s_arguments_and_pixels_are_timm_s() -> None:
    timm_aa = _timm()
    img = _photo(2)
    for op in sorted(set(autoaug.TIMM_RAND) | set(autoaug.TIMM_RAND_INCREASING)):
        for level in (0.0, 4.5, 9.0, 10.0):
            for seed in (1, 2):  # timm's sign draw is random.random() > 0.5: both signs over these seeds
                random.seed(seed)
                level_fn = timm_aa.LEVEL_TO_ARG[op]
                want_args = level_fn(level, {"translate_pct": 0.45}) if level_fn else ()
                random.seed(seed)
                value = autoaug._timm_level(op, level, _Fixed(random.random()))
                assert value == pytest.approx(want_args[0] if want_args else 0.0), (op, level)
                for resample in (Image.BILINEAR, Image.BICUBIC):
                    want = timm_aa.NAME_TO_OP[op](img, *want_args, fillcolor=autoaug.TIMM_FILL, resample=resample)
                    got = autoaug.apply(img, [autoaug.Choice(op, value, int(resample), timm=True)], autoaug.TIMM_FILL)
                    assert np.array_equal(np.asarray(got), np.asarray(want)), (op, level)


def _random_images(count: int) -> list[np.ndarray]:
    """uint8 HWC images: uniform noise, a narrow band of values (contrast and autocontrast tables where
    they bend), a photo; three channels and one."""
    rng = np.random.default_rng(7)
    out = [rng.integers(0, 256, (33, 47, 3), dtype=np.uint8) for _ in range(count)]
    out += [rng.integers(lo, lo + 40, (29, 31, 3), dtype=np.uint8) for lo in (0, 100, 215)]
    out += [np.asarray(_photo(5, 50, 40)), rng.integers(0, 256, (21, 26, 1), dtype=np.uint8)]
    return out


def _pil_of(arr: np.ndarray) -> Image.Image:
    return Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)


def test_the_array_form_of_each_sub_op_is_torchvision_s_at_every_magnitude() -> None:
    """apply_array (tables over the array where the op is one) against torchvision's _apply_op on the
    PIL image: every op of TrivialAugmentWide and RandAugment, every bin of both signs, several images."""
    images = _random_images(4)
    for wide in (True, False):
        space = autoaug.torchvision_space(31, 40, 50, wide=wide)
        for op in [*autoaug.TORCHVISION_WIDE, "Invert"]:
            magnitudes, signed = space[op]
            values = sorted({v for m in (magnitudes or [0.0]) for v in ([m, -m] if signed else [m])})
            for value in values if op not in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate") else values[::7]:
                for arr in images:
                    want = np.asarray(tv_autoaugment._apply_op(_pil_of(arr), op, value,
                                                               interpolation=InterpolationMode.BILINEAR, fill=None))
                    got = autoaug_arrays.apply_array(arr, [autoaug.Choice(op, value, int(Image.BILINEAR))], (0,))
                    assert got.dtype == np.uint8 and got.shape == arr.shape, (op, value)
                    assert np.array_equal(got.reshape(want.shape), want), (op, value, arr.shape)


@pytest.mark.parametrize("interp", [InterpolationMode.NEAREST, InterpolationMode.BILINEAR])
def test_whole_pixel_translations_are_torchvision_s_at_every_shift_and_fill(interp: InterpolationMode) -> None:
    """TranslateX / TranslateY as a copy: every whole-pixel shift either way (past the image too), odd and
    even sizes, gray, one fill and three, against torchvision's _apply_op."""
    from torchvision.transforms.functional import pil_modes_mapping

    rng = np.random.default_rng(9)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((17, 23, 3), (16, 20, 3), (15, 12, 1))]
    for arr in images:
        for op in ("TranslateX", "TranslateY"):
            for shift in range(-26, 27):
                for fill in (None, [7], [10, 200, 30][:arr.shape[2]]):
                    want = np.asarray(tv_autoaugment._apply_op(_pil_of(arr), op, float(shift), interpolation=interp,
                                                               fill=fill))
                    got = autoaug_arrays.apply_array(arr, [autoaug.Choice(op, float(shift), int(pil_modes_mapping[interp]))],
                                              fill or (0,))
                    assert np.array_equal(got.reshape(want.shape), want), (op, shift, fill, arr.shape)


def test_color_and_sharpness_tables_are_pil_s_blend_at_every_factor() -> None:
    """The blend table against PIL's blend over random pairs at many factors, torchvision's among them."""
    rng = np.random.default_rng(11)
    a = rng.integers(0, 256, (64, 64), dtype=np.uint8)
    b = rng.integers(0, 256, (64, 64), dtype=np.uint8)
    factors = [1.0 + m for m in autoaug.torchvision_space(31, 1, 1, wide=True)["Color"][0]]
    factors += [1.0 - m for m in autoaug.torchvision_space(31, 1, 1, wide=True)["Color"][0]]
    for factor in [*factors, *rng.uniform(-1.0, 3.0, 20).tolist()]:
        want = np.asarray(Image.blend(Image.fromarray(a), Image.fromarray(b), factor))
        got = autoaug_arrays._blend_table(factor)[a.astype(np.int64) * 256 + b]
        assert np.array_equal(got, want), factor


def test_the_array_form_of_timm_s_sub_ops_is_its_pil_form_at_random_levels() -> None:
    """timm's magnitudes are continuous (a Gaussian level): its table ops at random factors on the array
    against the PIL form (which the test above checks against timm's own functions)."""
    rng = np.random.default_rng(3)
    images = _random_images(2)
    for op in sorted(set(autoaug.TIMM_RAND) | set(autoaug.TIMM_RAND_INCREASING)):
        for level in rng.uniform(0.0, 10.0, 12):
            value = autoaug._timm_level(op, float(level), _Fixed(float(rng.random())))
            choices = [autoaug.Choice(op, value, int(Image.BICUBIC), timm=True)]
            for arr in images:
                want = np.asarray(autoaug.apply(_pil_of(arr), choices, autoaug.TIMM_FILL))
                got = autoaug_arrays.apply_array(arr, choices, autoaug.TIMM_FILL)
                assert np.array_equal(got.reshape(want.shape), want), (op, value)


def test_apply_array_chains_table_and_pil_sub_ops_as_apply_does() -> None:
    """Two and three ops in a row (RandAugment, AutoAugment), table ops before and after PIL ones."""
    rng = np.random.default_rng(4)
    names = [*autoaug.TORCHVISION_WIDE, "Invert"]
    space = autoaug.torchvision_space(31, 33, 47, wide=False)
    for arr in _random_images(3):
        for _ in range(40):
            choices = []
            for op in rng.choice(names, size=int(rng.integers(2, 4))):
                magnitudes = space[str(op)][0]
                choices.append(autoaug.Choice(str(op), magnitudes[int(rng.integers(len(magnitudes)))] if magnitudes
                                              else 0.0, int(Image.NEAREST)))
            want = np.asarray(autoaug.apply(_pil_of(arr), choices, (0,)))
            assert np.array_equal(autoaug_arrays.apply_array(arr, choices, (0,)).reshape(want.shape), want), choices


class _Fixed:
    """An rng whose every draw is one value."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.value

    def randint(self, a: int, b: int) -> int:
        return a


# --- choice and magnitude distributions ------------------------------------------------------

def _record_torchvision(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    seen: list[tuple[str, float]] = []
    real = tv_autoaugment._apply_op

    def spy(img: Any, op_name: str, magnitude: float, **kw: Any) -> Any:
        seen.append((op_name, round(magnitude, 4)))
        return img

    monkeypatch.setattr(tv_autoaugment, "_apply_op", spy)
    assert real is not spy
    return seen


def test_trivial_augment_wide_chooses_ops_and_magnitudes_as_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_torchvision(monkeypatch)
    img = _photo()
    torch.manual_seed(0)
    transform = tv_autoaugment.TrivialAugmentWide()
    n = 6000
    for _ in range(n):
        transform(img)
    ours = [c for d in _draws(n) for c in autoaug.choose_trivial_wide(d, 31, 0)]
    assert_same_counts(Counter(op for op, _ in seen), Counter(c.op for c in ours))
    assert_same_counts(Counter(m for op, m in seen if op == "Rotate"),
                       Counter(round(c.magnitude, 4) for c in ours if c.op == "Rotate"))
    signs = Counter(m > 0 for _, m in seen if _ != "Identity" and m != 0 and _ in ("ShearX", "Brightness"))
    assert_same_counts(signs, Counter(c.magnitude > 0 for c in ours if c.op in ("ShearX", "Brightness") and c.magnitude))


def test_rand_augment_torchvision_and_auto_augment_choose_as_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_torchvision(monkeypatch)
    img = _photo()
    torch.manual_seed(1)
    n = 3000
    for _ in range(n):
        tv_autoaugment.RandAugment(num_ops=2, magnitude=9)(img)
    ours = [c for d in _draws(n, 1) for c in autoaug.choose_rand_torchvision(d, 2, 9, 31, img.height, img.width, 0)]
    assert len(ours) == len(seen) == 2 * n
    assert_same_counts(Counter(seen), Counter((c.op, round(c.magnitude, 4)) for c in ours))
    seen.clear()
    for _ in range(n):
        tv_autoaugment.AutoAugment()(img)
    ours = [c for d in _draws(n, 2) for c in autoaug.choose_auto_imagenet(d, img.height, img.width, 0)]
    assert_same_counts(Counter(seen), Counter((c.op, round(c.magnitude, 4)) for c in ours))


def test_rand_augment_timm_m9_mstd05_inc1_chooses_as_timm() -> None:
    timm_aa = _timm()
    random.seed(0)
    np.random.seed(0)
    transform = timm_aa.rand_augment_transform("rand-m9-mstd0.5-inc1", {"translate_const": 100,
                                                                        "img_mean": autoaug.TIMM_FILL})
    seen_ops: list[str] = []
    seen_levels: list[float] = []
    for op in transform.ops:
        def aug(img: Any, *args: Any, _name: str = op.name, **kw: Any) -> Any:
            seen_ops.append(_name)
            return img

        def level(magnitude: float, hparams: Any, _fn: Any = op.level_fn) -> Any:
            seen_levels.append(magnitude)
            return _fn(magnitude, hparams) if _fn else ()

        op.aug_fn, op.level_fn = aug, level
    img = _photo()
    n = 4000
    for _ in range(n):
        transform(img)
    ours = [c for d in _draws(n, 3) for c in autoaug.choose_rand_timm(d, 2, 9.0, 0.5, True, 0.5, [2, 3])]
    assert set(seen_ops) <= set(autoaug.TIMM_RAND_INCREASING)
    assert_same_counts(Counter(seen_ops), Counter(c.op for c in ours))  # which ops, and how often one is skipped
    assert abs(len(ours) - len(seen_ops)) < 4 * math.sqrt(2 * n * 0.25)  # each op applied with probability 0.5
    levels = [_level_of(c) for c in ours if c.op == "Rotate"]  # the level, Gaussian around 9 with std 0.5, clipped
    assert_same_distribution([v for v, op in zip(seen_levels, seen_ops) if op == "Rotate"], levels)


def _level_of(c: autoaug.Choice) -> float:
    return abs(c.magnitude) / 30.0 * 10.0  # Rotate: degrees = level / 10 * 30


# --- random erasing ---------------------------------------------------------------------------

def test_random_erasing_area_and_aspect_are_torchvision_s() -> None:
    from torchvision.transforms import RandomErasing

    torch.manual_seed(0)
    params = {"probability": 1.0, "scale": (0.02, 0.33), "ratio": (0.3, 3.3), "value": (0.0,)}
    height, width = 40, 56
    t = torch.zeros(3, height, width)
    n = 3000
    theirs = [RandomErasing.get_params(t, scale=params["scale"], ratio=params["ratio"], value=[0.0])[:4]
              for _ in range(n)]
    ours = [recipe.erase_box(d, height, width, params) for d in _draws(n, 4)]
    ours = [b if b is not None else (0, 0, height, width) for b in ours]
    assert_same_distribution([h * w for _, _, h, w in theirs], [h * w for _, _, h, w in ours])
    assert_same_distribution([math.log(h / w) for _, _, h, w in theirs if w], [math.log(h / w) for _, _, h, w in ours if w])
    assert_same_distribution([i for i, _, _, _ in theirs], [i for i, _, _, _ in ours])
    rate = sum(recipe.erase_box(d, height, width, {**params, "probability": 0.25}) is not None for d in _draws(n, 5))
    assert abs(rate / n - 0.25 * 0.985) < 4 * math.sqrt(0.25 * 0.75 / n)  # ~1.5% of boxes never fit in 10 tries


def test_random_erasing_erases_the_normalized_tensor_in_its_layout() -> None:
    arr = np.ones((3, 20, 30), dtype=np.float32)
    d = _draws(1)[0]
    recipe._erase(arr, {"probability": 1.0, "scale": (0.1, 0.1), "ratio": (1.0, 1.0), "value": (-2.0, 0.0, 5.0),
                        "layout": "CHW"}, d)
    erased = arr[0] == -2.0
    assert erased.sum() == 60 or abs(int(erased.sum()) - 60) <= 15  # 10% of 600 pixels, a square box
    assert np.all(arr[1][erased] == 0.0) and np.all(arr[2][erased] == 5.0) and np.all(arr[:, ~erased] == 1.0)
    hwc = np.ones((20, 30, 3), dtype=np.float32)
    recipe._erase(hwc, {"probability": 1.0, "scale": (0.1, 0.1), "ratio": (1.0, 1.0), "value": "random",
                        "layout": "HWC"}, _draws(1)[0].replay())
    assert (hwc != 1.0).all(axis=2).sum() == erased.sum()  # the same draws give the same box in either layout


# --- on every backend -----------------------------------------------------------------------

RECIPE = ["decode", {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5}},
          {"trivial_augment_wide": {"interpolation": "linear"}}, "normalize",
          {"random_erasing": {"probability": 0.5}}]


def _recipe_spec(ops: list[Any] = RECIPE) -> Any:
    from feedfast.spec import load_spec

    return load_spec({"pipeline": {"image": ops, "label": ["label"]}, "outputs": ["image", "label"],
                      "batch": {"size": 4}, "seed": 3})


def _epoch(spec: Any, shards: list[str], backend: str, *, workers: int = 2, epoch: int = 0) -> list[Any]:
    from feedfast import _env
    from feedfast.compile.build import build_plan
    from feedfast.loader.backends.cpu.pil import run_pil_epoch
    from feedfast.loader.backends.cpu.threads import run_thread_epoch
    from feedfast.order.deal import plan_epoch
    from feedfast.sources.dataset import open_shards

    sset = open_shards(shards, spec, _env.cache_dir())
    ep = plan_epoch(list(sset.sizes), batch_size=spec.batch_size, rank=0, world=1, last_batch=spec.last_batch,
                    seed=spec.seed, epoch=epoch, shuffle_shards=spec.shuffle_shards)
    run = run_thread_epoch if backend == "threads" else run_pil_epoch
    return list(run(build_plan(spec, device="cpu"), sset, ep, rank=0, world=1, batch_size=spec.batch_size,
                    workers=workers if backend == "threads" else 0, seed=spec.seed, epoch=epoch, start=0))


@pytest.fixture()
def no_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    from feedfast.loader.backends.cpu import thread_sample
    monkeypatch.setattr(thread_sample, "_DRAFT_FACTORS", ())


@pytest.mark.usefixtures("no_draft")
@pytest.mark.parametrize("op", [{"trivial_augment_wide": {"interpolation": "linear"}},
                                {"rand_augment": {"flavour": "timm", "magnitude": 9, "magnitude_std": 0.5,
                                                  "increasing": True}},
                                {"rand_augment": {}}, {"auto_augment": {}}], ids=["ta", "timm", "ra", "aa"])
@pytest.mark.parametrize("one_call", [True, False], ids=["one-call", "pillow"])
def test_the_threaded_path_runs_the_recipe_with_the_pil_backend_s_pixels(shards: list[str], op: Any, one_call: bool,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Geometry planned in C, the recipe op after it in the worker threads, random erasing on the
    normalized batch: the pil backend's pixels exactly (full-size decoding, the same draws), whether the
    uint8 pixels the op runs on are made by the extension in one call or by Pillow."""
    from feedfast.compile.build import build_plan
    from feedfast.compile.pil import compile_pil
    from feedfast.loader.backends.cpu import batchplan, native
    from feedfast.loader.backends.cpu.threads import chunk_way, fast_path_supported

    if one_call and (batchplan.ext is None or native.resample_flavour() is None):
        pytest.skip("the extension's one call is not built here")
    monkeypatch.setattr(batchplan, "ONE_CALL", one_call)
    spec = _recipe_spec([*RECIPE[:3], op, *RECIPE[4:]])
    plan = build_plan(spec, device="cpu")
    assert fast_path_supported(plan)  # backend auto stays on the threaded path
    if batchplan.ext is not None:
        chain = batchplan.chain_of(compile_pil(spec))
        assert chain is not None and [s.op for s in chain.kernels] == [next(iter(op))]
        assert "planned in C" in chunk_way(plan)
        assert ("one call" in chunk_way(plan)) == one_call
    threads, pil = _epoch(spec, shards, "threads"), _epoch(spec, shards, "pil")
    assert len(threads) == len(pil) == 6
    changed = 0
    for a, b in zip(threads, pil):
        assert a.origins == b.origins and torch.equal(a.fields["image"], b.fields["image"])
        changed += int((a.fields["image"] == 0).all(dim=1).flatten(1).any(dim=1).sum())  # erased boxes (value 0)
    assert changed > 0


def test_the_recipe_s_draws_are_a_function_of_seed_epoch_and_sample(shards: list[str]) -> None:
    spec = _recipe_spec()
    one, two = _epoch(spec, shards, "threads", workers=1), _epoch(spec, shards, "threads", workers=2)
    assert all(torch.equal(a.fields["image"], b.fields["image"]) for a, b in zip(one, two))
    later = _epoch(spec, shards, "threads", epoch=1)
    assert not all(torch.equal(a.fields["image"], b.fields["image"]) for a, b in zip(one, later))


def test_the_shipped_recipe_validates_and_runs_on_the_threaded_path() -> None:
    from pathlib import Path

    from feedfast.compile.build import build_plan
    from feedfast.loader.backends.cpu.threads import fast_path_supported
    from feedfast.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "pipelines" / "imagenet-train-recipe.yaml")
    ops = [call.op for call in spec.fields["image"].ops]
    assert ops == ["decode", "random_resized_crop", "flip", "trivial_augment_wide", "normalize", "random_erasing"]
    assert spec.fields["image"].ops[-1].params["probability"] == 0.1
    assert fast_path_supported(build_plan(spec, device="cpu"))


def test_bad_recipe_parameters_are_spec_errors_naming_the_key() -> None:
    from feedfast.errors import SpecError

    with pytest.raises(SpecError, match="flavour: timm"):
        _recipe_spec([*RECIPE[:2], {"rand_augment": {"magnitude_std": 0.5}}])
    with pytest.raises(SpecError, match="must be smaller"):
        _recipe_spec([*RECIPE[:2], {"rand_augment": {"magnitude": 31}}])
    with pytest.raises(SpecError, match="normalize"):
        _recipe_spec(["decode", "random_erasing"])
    with pytest.raises(SpecError, match="value"):
        _recipe_spec(["decode", "normalize", {"random_erasing": {"value": "noise"}}])


pytest.importorskip("nvidia.dali")


def _dali_batches(spec: Any, shards: list[str], steps: int = 2) -> list[Any]:
    import feedfast

    loader = feedfast.DataLoader(spec, shards=shards, backend="dali", placement="cpu", num_workers=1, device="cpu")
    out = []
    for i, batch in enumerate(loader):
        out.append(batch)
        if i + 1 == steps:
            break
    return out


@pytest.mark.parametrize("op", [{"trivial_augment_wide": {}}, {"rand_augment": {}}, {"auto_augment": {}}],
                         ids=["ta", "ra", "aa"])
def test_dali_cpu_runs_the_recipe_ops_through_auto_aug(shards: list[str], op: Any) -> None:
    spec = _recipe_spec([*RECIPE[:3], op, "normalize", {"random_erasing": {"probability": 1.0, "value": 0}}])
    batches = _dali_batches(spec, shards)
    image = batches[0]["image"] if isinstance(batches[0], dict) else batches[0][0]
    assert image.shape == (4, 3, 32, 32)
    erased = (image == 0).all(dim=1)  # every sample erased (probability 1): a box of zeros in every channel
    assert int(erased.flatten(1).any(dim=1).sum()) >= 3  # a box may, rarely, never fit in 10 attempts


def test_the_gpu_plan_places_the_recipe_ops_on_the_gpu_and_dali_serializes_it() -> None:
    from feedfast.compile.build import build_plan
    from feedfast.compile.dali import ReaderConfig, build_pipeline

    plan = build_plan(_recipe_spec([*RECIPE[:3], {"trivial_augment_wide": {}}, {"rand_augment": {}},
                                    {"auto_augment": {}}, *RECIPE[4:]]), device="gpu")
    devices = {n.op: n.device for n in plan.nodes}
    assert all(devices[op] == "gpu" for op in ("trivial_augment_wide", "rand_augment", "auto_augment",
                                                 "random_erasing"))
    pipe, _ = build_pipeline(plan, ReaderConfig(paths=["x.tar"], index_paths=["x.idx"]), batch_size=2,
                             num_threads=1, device_id=None, seed=1)
    text = pipe.serialize()
    assert b"erase" in text.lower() and b"warpaffine" in text.lower().replace(b"_", b"")


def test_timm_rand_augment_is_refused_by_dali_naming_why(shards: list[str]) -> None:
    from feedfast.compile.build import build_plan
    from feedfast.compile.dali import ReaderConfig, build_pipeline
    from feedfast.errors import BackendError

    plan = build_plan(_recipe_spec([*RECIPE[:2], {"rand_augment": {"flavour": "timm"}}]), device="cpu")
    with pytest.raises(BackendError, match="flavour timm"):
        build_pipeline(plan, ReaderConfig(paths=["x.tar"], index_paths=["x.idx"]), batch_size=2, num_threads=1,
                       device_id=None, seed=1)


@pytest.mark.parametrize("value", [(-1.0, 2.0, 3.0), "random"])
def test_dali_random_erasing_draws_torchvision_s_boxes(value: Any) -> None:
    """DALI's form (the 10 attempts as arithmetic, then ``fn.erase``): erased areas and aspect ratios
    against torchvision's ``RandomErasing.get_params`` (KS at 0.001), the values where the box is."""
    from nvidia.dali import fn, pipeline_def
    from torchvision.transforms import RandomErasing

    from feedfast.compile.dali import EmitContext
    from feedfast.ops import _dali_recipe

    height, width, batch = 40, 56, 64
    params = {"probability": 1.0, "scale": (0.02, 0.33), "ratio": (0.3, 3.3), "value": value}

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, seed=11)
    def pipe():  # type: ignore[no-untyped-def]
        x = fn.external_source(source=lambda: [np.zeros((3, height, width), np.float32)] * batch, batch=True,
                               layout="CHW")
        ctx = EmitContext(device="cpu", decoder_device="cpu", in_hw=(float(height), float(width)), layout="CHW")
        return _dali_recipe.random_erasing_dali(ctx, params, x)

    p = pipe()
    p.build()
    boxes = []
    for _ in range(20):
        (out,) = p.run()
        for i in range(batch):
            img = np.asarray(out[i])
            mask = img[0] == -1.0 if value != "random" else img[0] != 0.0  # normal noise: never exactly 0
            if value != "random":
                assert np.array_equal(mask, img[1] == 2.0) and np.array_equal(mask, img[2] == 3.0)
            else:
                assert np.array_equal(mask, img[1] != 0.0) and abs(float(img[0][mask].std()) - 1.0) < 0.5
            rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
            if len(rows):
                h, w = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
                assert mask.sum() == h * w  # one box
                boxes.append((h, w))
    torch.manual_seed(0)
    theirs = [RandomErasing.get_params(torch.zeros(3, height, width), scale=params["scale"], ratio=params["ratio"],
                                       value=[0.0])[2:4] for _ in range(len(boxes))]
    theirs = [(h, w) for h, w in theirs if (h, w) != (height, width)]  # torchvision's "no box": nothing erased
    assert_same_distribution([h * w for h, w in theirs], [h * w for h, w in boxes])
    assert_same_distribution([math.log(h / w) for h, w in theirs], [math.log(h / w) for h, w in boxes])


@pytest.mark.parametrize("op", [{"trivial_augment_wide": {}}, {"rand_augment": {"num_ops": 4}}, {"auto_augment": {}}],
                         ids=["ta", "ra", "aa"])
def test_dali_cpu_runs_the_recipe_ops_on_gray_images(shards: list[str], op: Any) -> None:
    """On one channel torchvision's Color is the identity; DALI's saturation there corrupted the heap and aborted
    the process (DALI 2.4), so the DALI suite holds the identity in its place. 23 samples, 4 ops each for
    rand_augment: Color comes up with near certainty."""
    from feedfast.compile.dali import EmitContext
    from feedfast.ops import _dali_recipe

    assert "one channel" in _dali_recipe._color(EmitContext("cpu", "cpu", channels=1), 0.9).name
    assert _dali_recipe._color(EmitContext("cpu", "cpu", channels=3), 0.9).name == "color"
    gray = {"decode": {"color": "gray"}}
    spec = _recipe_spec([gray, *RECIPE[1:3], op, {"normalize": {"mean": [0.5], "std": [0.25]}}])
    batches = _dali_batches(spec, shards, steps=6)
    images = [b["image"] if isinstance(b, dict) else b[0] for b in batches]
    assert sum(len(x) for x in images) == 23 and all(x.shape[1:] == (1, 32, 32) for x in images)
