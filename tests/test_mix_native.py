"""feedfast._batchmix.mix_into (feedfast/_mix.c): the batch mix in place in C equals torch's arithmetic bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from feedfast.ops import batchmix
from feedfast.ops.batchmix import MixParams, MixSettings, draw_params, mix_images

pytestmark = pytest.mark.skipif(batchmix._native is None, reason="feedfast._native is not built")


def torch_mix(images: torch.Tensor, p: MixParams, layout: str) -> torch.Tensor:
    """The torch operations' result (a new tensor: the C extension is not used)."""
    return mix_images(images, p, layout)


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
@pytest.mark.parametrize("convention,mode", [("timm", "batch"), ("timm", "pair"), ("timm", "elem"),
                                             ("torchvision", "batch")])
@pytest.mark.parametrize("batch", [1, 2, 5, 8])
def test_in_place_equals_torchs_operations(layout: str, dtype: torch.dtype, convention: str, mode: str,
                                           batch: int) -> None:
    settings = MixSettings(num_classes=4, mixup_alpha=0.8, cutmix_alpha=1.0, mode=mode, switch_prob=0.5,
                           convention=convention)
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        shape = (batch, 3, 13, 11) if layout == "CHW" else (batch, 13, 11, 3)
        x = torch.randn(shape, generator=g) if dtype == torch.float32 else \
            torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        p = draw_params(settings, np.random.default_rng(seed), batch, 13, 11)
        want = torch_mix(x, p, layout)
        got = x.clone()
        assert batchmix.mix_into(got, p, layout == "CHW")
        assert torch.equal(got, want), (seed, p)


def test_mixed_blends_and_cuts_over_a_long_cycle() -> None:
    """One permutation cycle through the whole batch, samples that blend, cut and stay: each reads its partner's
    pixels as they were."""
    b = 7
    lam = np.array([0.3, 1.0, 0.6, 0.45, 1.0, 0.2, 0.9])
    cut = np.array([False, False, True, False, True, True, False])
    boxes = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [1, 5, 2, 9], [0, 0, 0, 0], [0, 9, 0, 4], [3, 4, 3, 4],
                      [0, 0, 0, 0]], dtype=np.int64)
    partner = np.array([(i + 3) % b for i in range(b)])
    p = MixParams(lam=lam, cut=cut, boxes=boxes, partner=partner)
    x = torch.randn(b, 3, 9, 10)
    want = torch_mix(x, p, "CHW")
    assert batchmix.mix_into(x, p, True) and torch.equal(x, want)


def test_loader_path_is_the_c_one_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """mix_images(inplace=True) on a contiguous CPU batch goes through the extension, and torch's in-place
    operations (the GPU's path) give the same pixels when it is not there."""
    settings = MixSettings(num_classes=4, mixup_alpha=1.0, cutmix_alpha=1.0, mode="elem")
    x = torch.randn(6, 3, 8, 8)
    p = draw_params(settings, np.random.default_rng(0), 6, 8, 8)
    want = torch_mix(x, p, "CHW")
    calls: list[int] = []
    real = batchmix._native.mix_into
    monkeypatch.setattr(batchmix._native, "mix_into", lambda *a: (calls.append(1), real(*a))[1])
    got = x.clone()
    assert mix_images(got, p, "CHW", inplace=True).data_ptr() == got.data_ptr() and calls
    assert torch.equal(got, want)
    monkeypatch.setattr(batchmix, "_native", None)
    other = x.clone()
    assert torch.equal(mix_images(other, p, "CHW", inplace=True), want)


def test_what_it_cannot_take_falls_back_or_is_refused() -> None:
    p = MixParams(lam=np.full(4, 0.5), cut=np.zeros(4, dtype=bool), boxes=np.zeros((4, 4), dtype=np.int64),
                  partner=np.arange(4)[::-1].copy())
    assert not batchmix.mix_into(torch.randn(4, 3, 8, 8).transpose(2, 3), p, True)  # not contiguous
    assert not batchmix.mix_into(torch.randn(4, 3, 8, 8, dtype=torch.float64), p, True)
    bad = MixParams(lam=p.lam, cut=p.cut, boxes=p.boxes, partner=np.array([0, 0, 1, 2]))
    with pytest.raises(ValueError, match="permutation"):
        batchmix.mix_into(torch.randn(4, 3, 8, 8), bad, True)
    outside = MixParams(lam=p.lam, cut=np.ones(4, dtype=bool), boxes=np.tile([0, 9, 0, 4], (4, 1)),
                        partner=p.partner)
    with pytest.raises(ValueError, match="outside the image"):
        batchmix.mix_into(torch.randn(4, 3, 8, 8), outside, True)
