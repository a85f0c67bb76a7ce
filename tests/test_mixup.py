"""feedfast.Mixup: timm's call, mixup_fn(x, y), as an object for the batch hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import feedfast
from feedfast.errors import UserError
from feedfast.ops.batchmix import MixSettings, draw_params, mix_images, soft_targets
from feedfast.order.draws import batch_generator


def test_call_is_the_pure_functions_over_its_own_counter_draws() -> None:
    mixup = feedfast.Mixup(num_classes=4, mixup_alpha=0.4, cutmix_alpha=1.0, mode="pair", seed=7)
    x, y = torch.randn(6, 3, 9, 9), torch.tensor([0, 1, 2, 3, 0, 1])
    first = mixup(x, y)
    p = draw_params(MixSettings(num_classes=4, mixup_alpha=0.4, cutmix_alpha=1.0, mode="pair"),
                    batch_generator("mixup", 7, 0), 6, 9, 9)
    assert torch.equal(first[0], mix_images(x, p)) and torch.equal(first[1], soft_targets(y, p, 4, 0.1))
    second = mixup((x, y))  # a batch given whole, as collate_fn gives it
    assert mixup.state_dict() == {"seed": 7, "calls": 2} and not torch.equal(second[1], first[1])
    again = feedfast.Mixup(num_classes=4, mixup_alpha=0.4, cutmix_alpha=1.0, mode="pair", seed=7)
    again.load_state_dict({"seed": 7, "calls": 1})
    assert torch.equal(again(x, y)[1], second[1])


def test_as_the_loaders_batch_hook(small_spec: dict, shards: list[str]) -> None:
    mixup = feedfast.Mixup(num_classes=10, mixup_alpha=0.8, cutmix_alpha=1.0)
    loader = feedfast.DataLoader(small_spec, shards=shards, num_workers=2, backend="threads", collate_fn=mixup)
    shapes = [(tuple(x.shape), tuple(y.shape)) for x, y in loader]
    assert shapes == [((4, 3, 32, 32), (4, 10))] * 5 + [((3, 3, 32, 32), (3, 10))]


@pytest.mark.parametrize("kw,word", [(dict(mode="x"), "mode"), (dict(num_classes=0), "num_classes"),
                                     (dict(layout="NCHW"), "layout"), (dict(label_smoothing=-0.1), "label_smoothing")])
def test_bad_arguments_are_named(kw: dict, word: str) -> None:
    with pytest.raises(UserError, match=word):
        feedfast.Mixup(**{"num_classes": 10, **kw})


def test_bad_batches_are_refused() -> None:
    mixup = feedfast.Mixup(num_classes=3)
    with pytest.raises(UserError, match="4-d image batch"):
        mixup(torch.zeros(2, 3), torch.zeros(2))
    with pytest.raises(UserError, match="outside the 3 classes"):
        mixup(torch.zeros(2, 3, 4, 4), torch.tensor([0, 5]))
    with pytest.raises(UserError, match="2 images and 3 labels"):
        mixup(torch.zeros(2, 3, 4, 4), torch.tensor([0, 1, 2]))
    assert np.isfinite(mixup(torch.zeros(1, 3, 4, 4), torch.tensor([1]))[1].numpy()).all()


def test_mixup_enabled_false_mixes_nothing_as_timms() -> None:
    """timm's ``mixup_fn.mixup_enabled = False`` (its --mixup-off-epoch): pixels as they were, own smoothed targets."""
    mixup = feedfast.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=5, label_smoothing=0.1)
    mixup.mixup_enabled = False
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    mixed, soft = mixup(x.clone(), y)
    assert torch.equal(mixed, x)
    assert torch.allclose(soft, torch.nn.functional.one_hot(y, 5).float() * 0.9 + 0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_call_leaves_the_callers_tensor_and_equals_the_torch_mix(dtype: torch.dtype) -> None:
    """On the CPU the mix runs on a copy in place (the C extension where built); the pixels are the torch
    operations' and the tensor given stays as it was."""
    mixup = feedfast.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=5, mode="elem")
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 3, 9, 9, generator=g) if dtype == torch.float32
         else torch.randint(0, 256, (6, 3, 9, 9), generator=g, dtype=torch.uint8))
    given = x.clone()
    for _ in range(4):
        params = draw_params(mixup.settings, batch_generator("mixup", mixup.seed, mixup.calls), 6, 9, 9)
        mixed, _ = mixup(x, torch.arange(6) % 5)
        assert torch.equal(x, given) and torch.equal(mixed, mix_images(x, params))
