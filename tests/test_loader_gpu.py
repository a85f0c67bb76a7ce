"""feedfast.DataLoader delivering to CUDA: the pinned ring, cheap transfer and GPU placement."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import feedfast

pytestmark = pytest.mark.gpu
SIZE, BATCH = 32, 4


def _fixed_spec(small_spec: dict) -> dict:
    """The small spec without random ops, so a CPU and a CUDA consumer see the same pixels."""
    spec = copy.deepcopy(small_spec)
    spec["pipeline"]["image"] = ["decode", {"resize": {"size": [SIZE, SIZE]}}, "normalize"]
    return spec


def _loader(spec: dict, shards: list[str], **kw: Any) -> feedfast.DataLoader:
    kw.setdefault("num_workers", 2)
    return feedfast.DataLoader(spec, shards=shards, **kw)


def _stall_current_stream() -> None:
    """Keep the consumer's stream busy, so copies and slot reuse race if the ring lets them."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(20_000_000)


def test_cpu_pipeline_to_cuda_matches_the_cpu_run_and_bounds_pinned_memory(small_spec: dict,
                                                                            shards: list[str]) -> None:
    spec = _fixed_spec(small_spec)
    reference = [(x.clone(), y.clone()) for x, y in _loader(spec, shards, device="cpu", placement="cpu")]
    loader = _loader(spec, shards, device="cuda", placement="cpu", prefetch_factor=1)
    assert loader.plan.placement == "cpu"
    assert any(n.op == "normalize" and n.deferred for n in loader.plan.nodes)  # ships uint8, normalizes on CUDA
    ring = loader.ring
    bound = len(ring.slots) * BATCH * (3 * SIZE * SIZE + 8)  # depth x (uint8 image + int64 label) per batch
    for epoch in range(2):
        got = [(x, y) for x, y in loader]
        assert len(got) == len(reference) == 6
        for (x, y), (rx, ry) in zip(got, reference):
            assert x.device.type == "cuda" and y.device.type == "cuda"
            assert x.dtype == torch.float32 and x.shape == rx.shape == (x.shape[0], 3, SIZE, SIZE)
            assert torch.equal(y.cpu(), ry)
            torch.testing.assert_close(x.cpu(), rx, atol=1e-4, rtol=1e-5)
        assert 0 < ring.pinned_bytes <= bound, (epoch, ring.pinned_bytes, bound)
    assert all(t.is_pinned() for s in ring.slots for t in s.buffers.values())
    assert ring.copies == 12


def test_gpu_placement_gives_cuda_tensors_of_the_declared_shapes(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, device="cuda", placement="gpu")
    assert loader.plan.placement == "gpu"
    sizes = []
    for images, labels in loader:
        assert images.device.type == "cuda" and labels.device.type == "cuda"
        assert images.dtype == torch.float32 and images.shape[1:] == (3, SIZE, SIZE)
        assert labels.dtype == torch.int64 and labels.shape == (images.shape[0],)
        assert -2.2 < float(images.min()) and float(images.max()) < 2.7  # ImageNet-normalized range
        sizes.append(images.shape[0])
    assert sizes == [4, 4, 4, 4, 4, 3] and len(loader) == 6


def dali_cpu_reference(spec: dict, shards: list[str]) -> feedfast.DataLoader:
    """The CPU run GPU pixels are compared with: DALI's CPU decode and resize (``backend="dali"``).

    Not ``backend="auto"``: on the CPU that is the threaded path, whose reduced-size (DCT-scaled)
    JPEG decode differs from a full decode by more than the tolerance below.
    """
    return _loader(spec, shards, device="cpu", placement="cpu", backend="dali")


def test_gpu_pixels_match_the_cpu_pipeline(small_spec: dict, shards: list[str]) -> None:
    """nvJPEG + GPU resize against DALI's libjpeg-turbo + CPU resize, same spec and seed.

    Tolerance, in normalized units (1/255 of the range is about 0.017): mean |diff| < 0.02 and
    99% of values within 0.12 (about 7 levels of 255); the decoders' IDCTs and the resize
    kernels differ slightly, the geometry must not.
    """
    spec = _fixed_spec(small_spec)
    cpu = [(x.clone(), y.clone()) for x, y in dali_cpu_reference(spec, shards)]
    gpu = [(x.cpu(), y.cpu()) for x, y in _loader(spec, shards, device="cuda", placement="gpu")]
    assert len(cpu) == len(gpu) == 6
    for (x, y), (gx, gy) in zip(cpu, gpu):
        assert torch.equal(y, gy)
        diff = (x - gx).abs().flatten()
        assert float(diff.mean()) < 0.02, float(diff.mean())
        assert float(diff.quantile(0.99)) < 0.12, float(diff.quantile(0.99))


@pytest.mark.parametrize("placement", ["cpu", "gpu"])
def test_a_whole_epoch_makes_no_host_synchronization(small_spec: dict, shards: list[str], placement: str) -> None:
    loader = _loader(small_spec, shards, device="cuda", placement=placement)
    next(iter(_loader(small_spec, shards, device="cuda", placement=placement)))  # CUDA context, allocator warm
    torch.cuda.set_sync_debug_mode("error")
    try:
        n = sum(1 for _ in loader)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert n == 6


@pytest.mark.parametrize("placement", ["cpu", "gpu"])
def test_batches_kept_across_iterations_are_not_overwritten(small_spec: dict, shards: list[str],
                                                            placement: str) -> None:
    """Hold three batches while later ones are made into the same ring, then compare with a separate run."""
    spec = _fixed_spec(small_spec)
    reference = []
    for images, labels in _loader(spec, shards, device="cuda", placement=placement):
        torch.cuda.synchronize()
        reference.append((images.cpu(), labels.cpu()))
    loader = _loader(spec, shards, device="cuda", placement=placement, prefetch_factor=1)  # a ring of 3 slots
    kept = []
    for i, (images, labels) in enumerate(loader):
        if i < 3:
            kept.append((images, labels))  # no clone: the tensors themselves must stay intact
        _stall_current_stream()
    torch.cuda.synchronize()
    for (x, y), (rx, ry) in zip(kept, reference):
        assert torch.equal(y.cpu(), ry)
        assert torch.equal(x.cpu(), rx)
