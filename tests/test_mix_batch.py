"""The spec's batch.mix in the loader (feedfast.loader.batchmix_stage): soft targets out, resumable, per-rank draws."""

from __future__ import annotations

import copy

import pytest
import torch

import feedfast

MIX = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "mode": "elem", "num_classes": 10, "label_smoothing": 0.1}


def _spec(small_spec: dict, **mix: object) -> dict:
    spec = copy.deepcopy(small_spec)
    spec["batch"]["mix"] = {**MIX, **mix}
    return spec


def _loader(spec: dict, shards: list[str], **kw: object) -> feedfast.DataLoader:
    kw.setdefault("num_workers", 2)
    kw.setdefault("backend", "threads")
    return feedfast.DataLoader(spec, shards=shards, **kw)


def _epoch(loader: feedfast.DataLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def test_soft_targets_come_out_and_the_pixels_are_the_unmixed_batch_mixed(small_spec: dict, shards: list[str]) -> None:
    plain = _epoch(_loader(small_spec, shards))
    mixed_loader = _loader(_spec(small_spec), shards)
    mixed = _epoch(mixed_loader)
    assert [y.shape for _, y in mixed] == [(4, 10)] * 5 + [(3, 10)]
    changed = 0
    for (x0, y0), (x1, y1) in zip(plain, mixed):
        assert y1.dtype == torch.float32 and torch.allclose(y1.sum(1), torch.ones(len(y1)))
        # each row's largest share is its own label or its partner's (B - 1 - i), smoothing included
        partner = y0.flip(0)
        assert all(int(y1[i].argmax()) in (int(y0[i]), int(partner[i])) for i in range(len(y0)))
        changed += int(not torch.equal(x0, x1))
    assert changed >= 4  # prob 1: nearly every batch is mixed
    assert mixed_loader.stats()["delivered"] == 23


def test_a_resumed_epoch_mixes_exactly_as_the_uninterrupted_one(small_spec: dict, shards: list[str]) -> None:
    spec = _spec(small_spec)
    whole = _epoch(_loader(spec, shards, shuffle=True))
    first = _loader(spec, shards, shuffle=True)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    resumed = _loader(spec, shards, shuffle=True)
    resumed.load_state_dict(state)
    rest = _epoch(resumed)
    assert len(rest) == len(whole) - 2
    for (xa, ya), (xb, yb) in zip(whole[2:], rest):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_each_rank_draws_its_own(small_spec: dict, shards: list[str]) -> None:
    from feedfast.loader.batchmix_stage import mix_stage

    loader = _loader(_spec(small_spec, mode="batch"), shards)
    stages = [mix_stage(loader.spec, loader.plan, rank=r, world=2) for r in range(2)]
    from feedfast.order.draws import batch_generator
    lams = [[float(batch_generator(3, 0, s.rank, 2, step).random(1)[0]) for step in range(4)] for s in stages if s]
    assert lams[0] != lams[1]


def test_labels_outside_num_classes_fail_naming_the_batch(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(_spec(small_spec, num_classes=2), shards)
    with pytest.raises(feedfast.FeedfastError, match=r"batch.mix: epoch 0, batch \d+: labels run from"):
        _epoch(loader)


@pytest.mark.parametrize("backend", ["dali", "pil"])
def test_every_backend_yields_mixed_soft_targets(small_spec: dict, shards: list[str], backend: str) -> None:
    loader = _loader(_spec(small_spec, mode="pair"), shards, backend=backend, placement="cpu")
    shapes = [(tuple(x.shape), tuple(y.shape), y.dtype) for x, y in loader]
    assert shapes == [((4, 3, 32, 32), (4, 10), torch.float32)] * 5 + [((3, 3, 32, 32), (3, 10), torch.float32)]


@pytest.mark.gpu
@pytest.mark.parametrize("placement", ["cpu", "gpu"])
def test_on_a_gpu_the_mix_runs_on_the_device_and_equals_the_cpu_mix(small_spec: dict, shards: list[str],
                                                                    placement: str) -> None:
    import numpy as np

    from feedfast.ops.batchmix import MixSettings, draw_params, mix_images, soft_targets

    settings = MixSettings(num_classes=10, mixup_alpha=0.8, cutmix_alpha=1.0, mode="elem")
    x, y = torch.randn(6, 3, 16, 16), torch.randint(0, 10, (6,))
    p = draw_params(settings, np.random.default_rng(0), 6, 16, 16)
    assert torch.equal(mix_images(x.cuda(), p).cpu(), mix_images(x, p))
    torch.testing.assert_close(soft_targets(y.cuda(), p, 10, 0.1).cpu(), soft_targets(y, p, 10, 0.1))
    loader = _loader(_spec(small_spec), shards, backend="dali" if placement == "gpu" else "threads",
                     placement=placement, device="cuda")
    for images, targets in loader:
        assert images.is_cuda and targets.is_cuda and targets.shape[1] == 10
