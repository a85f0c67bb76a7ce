"""Batch mixup / cutmix (feedfast.ops.batchmix) against timm's ``Mixup`` and torchvision's v2 ``MixUp``/``CutMix``.

timm and torchvision are the ``test`` and ``compare`` extras (``make setup`` installs both).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from feedfast.ops.batchmix import MixParams, draw_params, mix_images, soft_targets
from feedfast.spec.batchmix_settings import MixSettings, problem
from tests.helpers import extra


class Legacy:
    """np.random's global RandomState behind the Generator names the draws use: timm's own stream."""

    def random(self, size: int) -> np.ndarray:
        return np.random.random(size)

    def beta(self, a: float, b: float, size: int) -> np.ndarray:
        return np.random.beta(a, b, size)

    def integers(self, low: int, high: int, size: int) -> np.ndarray:
        return np.random.randint(low, high, size)


def ks_2samp(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov statistic and the critical value at alpha 0.001 (asymptotic)."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    d = np.max(np.abs(np.searchsorted(a, grid, side="right") / len(a) - np.searchsorted(b, grid, side="right") / len(b)))
    crit = math.sqrt(-math.log(0.001 / 2) / 2) * math.sqrt((len(a) + len(b)) / (len(a) * len(b)))
    return float(d), crit


KNOBS = [
    dict(mixup_alpha=0.8, cutmix_alpha=1.0, mode="batch"),
    dict(mixup_alpha=0.8, cutmix_alpha=1.0, mode="pair", prob=0.7),
    dict(mixup_alpha=0.2, cutmix_alpha=1.0, mode="elem", switch_prob=0.3),
    dict(mixup_alpha=0.0, cutmix_alpha=1.0, mode="elem", correct_lam=False),
    dict(mixup_alpha=1.0, cutmix_alpha=0.0, mode="pair"),
    dict(mixup_alpha=0.5, cutmix_minmax=(0.2, 0.8), mode="batch", prob=0.9),
]


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_pixels_and_targets_equal_timms_from_timms_own_stream(knobs: dict) -> None:
    """Seeded as timm's global np.random, the draws, mixed pixels and soft targets are timm's exactly."""
    timm_mixup = extra("timm.data.mixup")
    settings = MixSettings(num_classes=7, label_smoothing=0.1, **knobs)
    timm = timm_mixup.Mixup(num_classes=7, label_smoothing=0.1, **knobs)
    for seed in range(12):
        x = torch.randn(8, 3, 17, 13)
        y = torch.randint(0, 7, (8,))
        np.random.seed(seed)
        want_x, want_y = timm(x.clone(), y.clone())
        np.random.seed(seed)
        params = draw_params(settings, Legacy(), 8, 17, 13)
        assert torch.equal(mix_images(x, params, "CHW"), want_x), seed
        assert torch.equal(soft_targets(y, params, 7, 0.1), want_y), seed


def test_hwc_layout_cuts_the_same_box() -> None:
    settings = MixSettings(num_classes=3, mixup_alpha=0.0, cutmix_alpha=1.0)
    x = torch.randn(4, 3, 10, 12)
    params = draw_params(settings, np.random.default_rng(0), 4, 10, 12)
    chw = mix_images(x, params, "CHW")
    hwc = mix_images(x.permute(0, 2, 3, 1).contiguous(), params, "HWC")
    assert torch.equal(hwc.permute(0, 3, 1, 2), chw) and not torch.equal(chw, x)


def test_uint8_blends_round_as_timms_fast_collate() -> None:
    x = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8)
    p = MixParams(np.full(4, 0.3, dtype=np.float32), np.zeros(4, dtype=bool), np.zeros((4, 4), dtype=np.int64),
                  np.arange(4)[::-1].copy())
    want = torch.round(x.float() * 0.3 + x.flip(0).float() * np.float32(0.7)).to(torch.uint8)
    assert torch.equal(mix_images(x, p, "CHW"), want)


def test_lambda_distribution_matches_timms() -> None:
    """The loader's counter-based draws (Philox) against timm's np.random: the lambdas, KS at alpha 0.001."""
    timm_mixup = extra("timm.data.mixup")
    from feedfast.order.draws import batch_generator

    knobs = dict(num_classes=10, mixup_alpha=0.8, cutmix_alpha=1.0, mode="elem", prob=0.8, correct_lam=False)
    settings, timm = MixSettings(**knobs), timm_mixup.Mixup(**knobs)  # lambdas as drawn, before any box corrects them
    np.random.seed(0)
    theirs = np.concatenate([timm._params_per_elem(64)[0] for _ in range(80)])
    ours = np.concatenate([draw_params(settings, batch_generator(0, 0, 0, 1, step), 64, 32, 32).lam
                           for step in range(80)])
    d, crit = ks_2samp(ours, theirs)
    assert d < crit, (d, crit)
    other = np.random.default_rng(1).beta(0.2, 0.2, len(ours))  # the test can fail: a wrong alpha is seen
    assert ks_2samp(ours, other)[0] > crit


def test_box_area_distribution_matches_timms() -> None:
    timm_mixup = extra("timm.data.mixup")
    from feedfast.order.draws import batch_generator

    settings = MixSettings(num_classes=10, mixup_alpha=0.0, cutmix_alpha=1.0, mode="elem")
    np.random.seed(3)
    theirs = []
    for _ in range(3000):
        lam = np.random.beta(1.0, 1.0)
        (yl, yh, xl, xh), _ = timm_mixup.cutmix_bbox_and_lam((3, 24, 20), lam, correct_lam=True)
        theirs.append((yh - yl) * (xh - xl))
    ours = []
    for step in range(50):
        p = draw_params(settings, batch_generator(5, 0, 0, 1, step), 64, 24, 20)
        ours += ((p.boxes[:, 1] - p.boxes[:, 0]) * (p.boxes[:, 3] - p.boxes[:, 2])).tolist()
    d, crit = ks_2samp(np.array(ours, float), np.array(theirs, float))
    assert d < crit, (d, crit)


def _torchvision_draws(transform, seed: int, h: int, w: int) -> tuple[float, tuple[int, int, int, int] | None]:
    """The lambda (and box) torchvision's transform draws after ``torch.manual_seed(seed)``, replayed."""
    torch.manual_seed(seed)
    lam = float(transform._dist.sample(()))
    if transform.__class__.__name__ == "MixUp":
        return lam, None
    rx, ry = int(torch.randint(w, size=(1,))), int(torch.randint(h, size=(1,)))
    r = 0.5 * math.sqrt(1.0 - lam)
    return lam, (max(ry - int(r * h), 0), min(ry + int(r * h), h), max(rx - int(r * w), 0), min(rx + int(r * w), w))


@pytest.mark.parametrize("kind", ["MixUp", "CutMix"])
def test_torchvision_recipe_pixels_and_targets(kind: str) -> None:
    """convention torchvision: for torchvision's lambda and box, its pixels exactly, and its targets once its loss
    smooths them (CrossEntropyLoss(label_smoothing=0.1)) equal ours with label_smoothing 0.1."""
    v2 = extra("torchvision.transforms.v2")

    transform = getattr(v2, kind)(alpha=1.0 if kind == "CutMix" else 0.2, num_classes=10)
    for seed in range(10):
        x, y = torch.randn(6, 3, 15, 11), torch.randint(0, 10, (6,))
        torch.manual_seed(seed)
        want_x, want_y = transform(x.clone(), y.clone())
        lam, box = _torchvision_draws(transform, seed, 15, 11)
        cut = box is not None
        boxes = np.tile(np.array(box if cut else (0, 0, 0, 0)), (6, 1))
        if cut:
            lam = 1.0 - (box[1] - box[0]) * (box[3] - box[2]) / (15 * 11)
        p = MixParams(np.full(6, lam), np.full(6, cut), boxes, (np.arange(6) - 1) % 6)
        assert torch.equal(mix_images(x, p, "CHW"), want_x)
        torch.testing.assert_close(soft_targets(y, p, 10, 0.0), want_y, rtol=0, atol=1e-6)
        logits = torch.randn(6, 10)
        theirs = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(logits, want_y)
        ours = torch.nn.CrossEntropyLoss()(logits, soft_targets(y, p, 10, 0.1))
        torch.testing.assert_close(ours, theirs)


def test_torchvision_box_area_distribution() -> None:
    v2 = extra("torchvision.transforms.v2")

    from feedfast.order.draws import batch_generator

    cutmix = v2.CutMix(alpha=1.0, num_classes=10)
    torch.manual_seed(0)
    theirs = []
    for _ in range(2000):
        x1, y1, x2, y2 = cutmix.make_params([torch.zeros(2, 3, 24, 20)])["box"]
        theirs.append((x2 - x1) * (y2 - y1))
    settings = MixSettings(num_classes=10, mixup_alpha=0.0, cutmix_alpha=1.0, convention="torchvision")
    ours = []
    for step in range(2000):
        p = draw_params(settings, batch_generator(1, 0, 0, 1, step), 2, 24, 20)
        ours.append(int((p.boxes[0, 1] - p.boxes[0, 0]) * (p.boxes[0, 3] - p.boxes[0, 2])))
    d, crit = ks_2samp(np.array(ours, float), np.array(theirs, float))
    assert d < crit, (d, crit)


@pytest.mark.parametrize("mode", ["pair", "elem", "batch"])
def test_odd_batch_middle_sample_is_its_own_partner(mode: str) -> None:
    settings = MixSettings(num_classes=5, mixup_alpha=1.0, cutmix_alpha=1.0, mode=mode, label_smoothing=0.0)
    x, y = torch.randn(5, 3, 8, 8), torch.tensor([0, 1, 2, 3, 4])
    p = draw_params(settings, np.random.default_rng(2), 5, 8, 8)
    assert p.partner[2] == 2
    assert torch.equal(mix_images(x, p, "CHW")[2], x[2])
    assert torch.equal(soft_targets(y, p, 5, 0.0)[2], torch.nn.functional.one_hot(y[2], 5).float())
    assert torch.allclose(soft_targets(y, p, 5, 0.0).sum(1), torch.ones(5))


def test_labels_outside_the_classes_are_refused() -> None:
    p = draw_params(MixSettings(num_classes=3), np.random.default_rng(0), 2, 4, 4)
    with pytest.raises(ValueError, match="outside the 3 classes"):
        soft_targets(torch.tensor([0, 3]), p, 3, 0.1)


@pytest.mark.parametrize("change,key", [
    (dict(num_classes=0), "num_classes"), (dict(mixup_alpha=-1.0), "mixup_alpha"), (dict(prob=1.5), "prob"),
    (dict(mode="pairs"), "mode"), (dict(cutmix_minmax=(0.8, 0.2)), "cutmix_minmax"),
    (dict(mixup_alpha=0.0), "mixup_alpha"), (dict(convention="torchvision", mode="elem"), "convention"),
])
def test_bad_settings_are_named(change: dict, key: str) -> None:
    assert problem(MixSettings(**{"num_classes": 10, **change}))[0] == key  # type: ignore[index]
    assert problem(MixSettings(num_classes=10)) is None


@pytest.fixture(params=["c", "torch"])
def in_place_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Mixing in place on the CPU through the C extension (where built), and through torch's operations (the GPU's)."""
    from feedfast.loader.backends.cpu import native
    if request.param == "torch":
        monkeypatch.setattr(native, "ext", None)
    elif not native.built():
        pytest.skip("feedfast._native is not built")
    return request.param


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_in_place_reads_every_source_before_writing(mode: str, in_place_path: str) -> None:
    """The loader mixes its own batch in place: pairs exchanging boxes must still see each other's originals."""
    settings = MixSettings(num_classes=3, mixup_alpha=1.0, cutmix_alpha=1.0, mode=mode, switch_prob=0.6)
    for seed in range(6):
        x = torch.randn(8, 3, 12, 12)
        p = draw_params(settings, np.random.default_rng(seed), 8, 12, 12)
        want = mix_images(x, p)
        assert torch.equal(mix_images(x.clone(), p, inplace=True), want)


def test_lambda_distribution_matches_torchvisions_mixup() -> None:
    v2 = extra("torchvision.transforms.v2")

    from feedfast.order.draws import batch_generator

    mixup = v2.MixUp(alpha=0.2, num_classes=10)
    torch.manual_seed(0)
    theirs = np.array([mixup.make_params([])["lam"] for _ in range(3000)])
    settings = MixSettings(num_classes=10, mixup_alpha=0.2, convention="torchvision")
    ours = np.array([draw_params(settings, batch_generator(2, 0, 0, 1, step), 2, 8, 8).lam[0] for step in range(3000)])
    d, crit = ks_2samp(ours, theirs)
    assert d < crit, (d, crit)


@pytest.mark.parametrize("convention", ["timm", "torchvision"])
def test_a_whole_batch_blended_in_place_equals_the_blend_into_a_new_tensor(convention: str, in_place_path: str) -> None:
    """The loader's own batch is mixed in place (one copy of the partners); the pixels are the new tensor's."""
    images = torch.randn(6, 3, 8, 8)
    partner = (np.arange(6) - 1) % 6 if convention == "torchvision" else np.arange(6)[::-1].copy()
    p = MixParams(lam=np.full(6, 0.3), cut=np.zeros(6, dtype=bool), boxes=np.zeros((6, 4), dtype=np.int64),
                  partner=partner)
    want = mix_images(images, p)
    got = images.clone()
    assert mix_images(got, p, inplace=True).data_ptr() == got.data_ptr()
    assert torch.equal(got, want) and not torch.equal(want, images)


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_cpu_soft_targets_equal_the_device_formula(mode: str) -> None:
    """On the CPU the targets are made in NumPy (torch's CPU kernels would wake its thread pool); they equal the
    torch operations a GPU runs, bit for bit."""
    rng = np.random.default_rng(1)
    for classes, batch, smoothing in [(1000, 64, 0.1), (10, 7, 0.0), (3, 1, 0.25)]:
        p = draw_params(MixSettings(num_classes=classes, mixup_alpha=0.8, cutmix_alpha=1.0, mode=mode), rng, batch, 8, 8)
        labels = torch.from_numpy(rng.integers(0, classes, batch))
        off = smoothing / classes
        one_hot = torch.full((batch, classes), off).scatter_(1, labels.view(-1, 1), 1.0 - smoothing + off)
        keep = torch.from_numpy(np.asarray(p.lam, dtype=np.float32))
        take = torch.from_numpy(np.asarray(1.0 - p.lam).astype(np.float32))
        want = one_hot * keep[:, None] + one_hot[torch.from_numpy(p.partner)] * take[:, None]
        got = soft_targets(labels, p, classes, smoothing)
        assert got.dtype == torch.float32 and torch.equal(got, want)
