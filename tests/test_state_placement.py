"""A state taken from a GPU-placed DALI loader resumes on the CPU-placed DALI path (issue 36): the rest of the epoch
holds the same samples in the same order, bit for bit, and its pixels differ by no more than two decoders do
(nvJPEG and DALI's GPU resize against libjpeg-turbo and its CPU resize).

The GPU tests need CUDA (``gpu`` marker); the operator check beside them runs anywhere DALI is: DALI checks a
state's checkpoint against the operators of the pipeline that loads it
(:func:`feedfast.loader.backends.dali.checkpoint.check_operators`), and a GPU-placed graph can be defined and
listed without a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import feedfast
from feedfast.errors import UserError
from tests.helpers import state_after

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
    """The loader's state after ``stop`` batches (:func:`tests.helpers.state_after`); the loader is closed."""
    state = state_after(loader, stop)
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
@pytest.mark.parametrize("stop", [3, EPOCH + 2], ids=["epoch0-no-checkpoint", "epoch1-checkpoint"])
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


def test_a_cpu_placed_pipeline_for_cuda_builds_another_graph(small_spec: dict, shards: list[str]) -> None:
    """Cheap transfer (a CPU pipeline for a cuda consumer ships uint8 and normalizes on the device) ends the graph in
    flip, not crop_mirror_normalize: a GPU-placed state's checkpoint names operators this graph lacks."""
    assert _operators(small_spec, shards, "gpu", "cuda") != _operators(small_spec, shards, "cpu", "cuda")


@pytest.mark.parametrize("jitter", [False, True], ids=["every-draw-fed", "a-draw-of-dali"])
def test_a_checkpoint_of_another_graph_is_set_aside_when_every_draw_is_fed(
        small_spec: dict, shards: list[str], monkeypatch: pytest.MonkeyPatch, jitter: bool) -> None:
    """A state whose DALI checkpoint is of another graph (as a GPU-placed state is to a CPU-placed loader delivering
    to cuda, simulated: the loading pipeline's operators are the cuda consumer's): where the crop and flip are fed
    as data and nothing else draws, the step alone resumes the uninterrupted run, bit for bit; where an op draws
    from DALI's generator, the checkpoint is needed and refused, naming it."""
    from feedfast.loader.backends.dali import backend

    if jitter:
        small_spec["pipeline"]["image"].insert(2, {"color_jitter": {"brightness": 0.3}})
    reference = _loader(small_spec, shards, "cpu", "cpu")
    whole = [batch for _ in range(2) for batch in _batches(reference)]
    reference.close()
    state = _state_after(_loader(small_spec, shards, "cpu", "cpu"), EPOCH + 2)
    assert state["dali"] is not None
    foreign = _operators(small_spec, shards, "cpu", "cuda")
    assert foreign is not None and foreign != _operators(small_spec, shards, "cpu", "cpu")
    real, calls = backend.pipeline_operators, []

    def loading_pipeline_is_another(plan: Any, *args: Any, **kw: Any) -> set[str] | None:
        calls.append(plan)  # the first: the loading loader's own graph; then the spec's graphs it compares against
        return foreign if len(calls) == 1 else real(plan, *args, **kw)

    monkeypatch.setattr(backend, "pipeline_operators", loading_pipeline_is_another)
    resumed = _loader(small_spec, shards, "cpu", "cpu")
    if jitter:
        with pytest.raises(UserError, match="dali.checkpoint"):
            resumed.load_state_dict(state)
        resumed.close()
        return
    resumed.load_state_dict(state)
    rest = _batches(resumed)
    resumed.close()
    assert [keys for _, keys in rest] == [keys for _, keys in whole[EPOCH + 2:]]
    assert all(torch.equal(x, wx) for (x, _), (wx, _) in zip(rest, whole[EPOCH + 2:]))
