"""A state taken from a GPU-placed DALI loader resumes on the CPU-placed DALI path (issue 36): the rest of the epoch
holds the same samples in the same order, bit for bit, and its pixels differ by no more than two decoders do
(nvJPEG and DALI's GPU resize against libjpeg-turbo and its CPU resize).

The GPU tests need CUDA (``gpu`` marker); the operator check beside them runs anywhere DALI is: DALI checks a
state's checkpoint against the operators of the pipeline that loads it
(:func:`feedfast.loader.backends.dali.checkpoint.check_operators`), and a GPU-placed graph can be defined and
listed without a GPU.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import feedfast
from feedfast.errors import UserError

EPOCH = 6
"""Batches an epoch of the ``shards`` fixture (23 samples) in batches of 4: 4, 4, 4, 4, 4, 3."""
MEAN_DIFF, Q99_DIFF = 0.02, 0.12
"""Pixels in normalized units (one 8-bit level is about 0.017): mean |difference| and its 99th percentile, as
tests/test_loader_gpu.py bounds nvJPEG + GPU resize against DALI's CPU decode and resize."""


def _loader(spec: dict, shards: list[str], placement: str, device: str, **kw: Any) -> feedfast.DataLoader:
    return feedfast.DataLoader(spec, shards=shards, backend="dali", shuffle=True, placement=placement, device=device,
                               num_workers=1, **kw)


def _batches(loader: feedfast.DataLoader, count: int | None = None) -> list[tuple[torch.Tensor, list[str]]]:
    """Up to ``count`` batches of the loader's next epoch (all without ``count``): pixels on the host, sample keys."""
    out = []
    for images, _ in loader:
        out.append((images.cpu(), [k for _, k in loader.last_origins]))
        if count is not None and len(out) == count:
            break
    return out


def _state_after(loader: feedfast.DataLoader, stop: int) -> dict[str, Any]:
    """The loader's state after ``stop`` batches taken epoch after epoch, through JSON as a checkpoint file holds it."""
    taken, it = 0, iter(loader)
    while taken < stop:
        try:
            next(it)
            taken += 1
        except StopIteration:
            it = iter(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


def _assert_same_rest(got: list[tuple[torch.Tensor, list[str]]], want: list[tuple[torch.Tensor, list[str]]]) -> None:
    """The same samples in the same order, bit for bit; the pixels within what the two decoders differ by."""
    assert [keys for _, keys in got] == [keys for _, keys in want]
    for i, ((x, _), (wx, _)) in enumerate(zip(got, want)):
        assert x.shape == wx.shape, (i, x.shape, wx.shape)
        diff = (x.float() - wx.float()).abs().flatten()
        assert float(diff.mean()) < MEAN_DIFF, (i, float(diff.mean()))
        assert float(diff.quantile(0.99)) < Q99_DIFF, (i, float(diff.quantile(0.99)))


@pytest.mark.gpu
def test_the_two_placements_deliver_the_same_epoch(small_spec: dict, shards: list[str]) -> None:
    """Without a resume: the premise of the test below (same order, same crop and flip draws, close pixels)."""
    gpu_loader, cpu_loader = _loader(small_spec, shards, "gpu", "cuda"), _loader(small_spec, shards, "cpu", "cpu")
    gpu, cpu = _batches(gpu_loader), _batches(cpu_loader)
    gpu_loader.close()
    cpu_loader.close()
    assert len(gpu) == len(cpu) == EPOCH
    _assert_same_rest(cpu, gpu)


@pytest.mark.gpu
@pytest.mark.parametrize(("stop", "sample_info"), [(3, False), (EPOCH + 2, False), (EPOCH + 3, True)],
                         ids=["epoch0-no-checkpoint", "epoch1-its-start-checkpoint", "epoch1-sample-info"])
def test_a_gpu_placed_state_resumes_on_the_cpu_placed_dali_path(small_spec: dict, shards: list[str], stop: int,
                                                                sample_info: bool) -> None:
    """A state after ``stop`` batches of a GPU-placed loader (mid-epoch 0, where it holds no DALI checkpoint; in
    epoch 1, where it holds the life pipeline's checkpoint of that epoch's start, or, under ``sample_info``, of the
    batch itself) resumes on ``placement="cpu"``: the rest of that epoch as the uninterrupted GPU-placed run."""
    reference = _loader(small_spec, shards, "gpu", "cuda")
    whole = [batch for _ in range(stop // EPOCH + 1) for batch in _batches(reference)]
    reference.close()
    state = _state_after(_loader(small_spec, shards, "gpu", "cuda", sample_info=sample_info), stop)
    assert state["epoch"] == stop // EPOCH and state["step"] == stop % EPOCH
    assert (state["dali"] is None) == (stop < EPOCH)  # the first epoch's first checkpoint comes later
    resumed = _loader(small_spec, shards, "cpu", "cpu", sample_info=sample_info)
    resumed.load_state_dict(state)
    rest = _batches(resumed)
    resumed.close()
    _assert_same_rest(rest, whole[stop:])


@pytest.mark.gpu
@pytest.mark.parametrize("stop", [3, pytest.param(EPOCH + 2, marks=pytest.mark.xfail(
    raises=UserError, strict=True,
    reason="refused today: a CPU-placed pipeline delivering to cuda ships uint8 and normalizes on the device (cheap "
           "transfer), so its DALI graph ends in flip, not crop_mirror_normalize, and check_operators finds the "
           "GPU-placed checkpoint's operators foreign"))], ids=["epoch0-no-checkpoint", "epoch1-checkpoint"])
def test_a_gpu_placed_state_on_a_cpu_placed_loader_delivering_to_cuda(small_spec: dict, shards: list[str],
                                                                      stop: int) -> None:
    reference = _loader(small_spec, shards, "gpu", "cuda")
    whole = [batch for _ in range(stop // EPOCH + 1) for batch in _batches(reference)]
    reference.close()
    state = _state_after(_loader(small_spec, shards, "gpu", "cuda"), stop)
    resumed = _loader(small_spec, shards, "cpu", "cuda")
    resumed.load_state_dict(state)
    rest = _batches(resumed)
    resumed.close()
    _assert_same_rest(rest, whole[stop:])


# ---------------------------------------------------------------------------- without a GPU
def _operators(small_spec: dict, shards: list[str], placement: str, consumer: str) -> set[str] | None:
    """The DALI operators of the life pipeline a loader of this placement and consumer builds (defined, not built)."""
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from feedfast.compile.build import build_plan
    from feedfast.loader.backends.dali.checkpoint import pipeline_operators

    loader = _loader(small_spec, shards, "cpu", "cpu")
    try:
        plan = build_plan(loader.spec, device=placement, consumer=consumer)
        return pipeline_operators(plan, loader.shards_for(0), fed=True, batch_size=4)
    finally:
        loader.close()


def test_a_gpu_placed_pipeline_has_the_operators_of_the_cpu_placed_one(small_spec: dict, shards: list[str]) -> None:
    """What lets a GPU-placed state's DALI checkpoint pass the CPU-placed loader's operator check."""
    gpu = _operators(small_spec, shards, "gpu", "cuda")
    assert gpu is not None and gpu == _operators(small_spec, shards, "cpu", "cpu")


@pytest.mark.xfail(strict=True, reason="cheap transfer (a CPU pipeline for a cuda consumer) emits flip instead of "
                                       "crop_mirror_normalize: another graph, so a GPU-placed checkpoint is refused")
def test_a_cpu_placed_pipeline_for_cuda_has_the_operators_of_the_gpu_placed_one(small_spec: dict,
                                                                                shards: list[str]) -> None:
    assert _operators(small_spec, shards, "gpu", "cuda") == _operators(small_spec, shards, "cpu", "cuda")
