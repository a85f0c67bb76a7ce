"""The pinned prefetch ring's logic on the CPU, through the same code path CUDA takes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import feedfast
from feedfast.errors import UserError
from feedfast.loader.prefetch import NullEvent, NullStream, PinnedRing, on_stream


class CountingEvent:
    """An event that records how often the ring waited on it."""

    def __init__(self) -> None:
        self.waits = 0

    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        self.waits += 1

    def query(self) -> bool:
        return True


def test_slots_rotate_and_depth_bounds_their_number() -> None:
    ring = PinnedRing("cpu", depth=3)
    assert len(ring.slots) == 3
    ids = [id(s) for s in ring.slots]
    taken = [ids.index(id(ring.slot())) for _ in range(7)]
    assert taken == [0, 1, 2, 0, 1, 2, 0]
    assert [s.uses for s in ring.slots] == [3, 2, 2]


def test_a_slot_is_reused_only_after_its_previous_copy_finished() -> None:
    ring = PinnedRing("cpu", depth=2)
    first = ring.slot()
    first.event = CountingEvent()
    ring.slot()
    assert first.event.waits == 0  # the other slot: no wait
    assert ring.slot() is first and first.event.waits == 1


@pytest.mark.parametrize("depth", [0, -1])
def test_depth_below_one_is_rejected(depth: int) -> None:
    with pytest.raises((ValueError, UserError), match="depth"):
        PinnedRing("cpu", depth=depth)


def test_cpu_staging_gives_a_fresh_tensor_each_call_and_holds_no_memory() -> None:
    ring = PinnedRing("cpu", depth=1, pin=True)
    assert not ring.cuda and not ring.pin  # pinning is a CUDA matter
    s = ring.slot()
    a = ring.staging(s, "image", (2, 3, 4), torch.float32)
    b = ring.staging(s, "image", (2, 3, 4), torch.float32)
    assert a.shape == (2, 3, 4) and a.dtype == torch.float32
    assert a.data_ptr() != b.data_ptr()
    assert ring.staging(ring.slot(), "image", (2, 3, 4), torch.float32).data_ptr() not in (a.data_ptr(), b.data_ptr())
    assert ring.pinned_bytes == 0 and s.buffers == {}


def test_staging_reuse_logic_bounds_memory_per_slot() -> None:
    """The CUDA branch of ``staging`` (reuse, grow, dtype change), run with unpinned host buffers."""
    ring = PinnedRing("cpu", depth=2, pin=False)
    ring.cuda = True  # white-box: exercise the reuse path without a GPU; upload() is not called
    s = ring.slot()
    a = ring.staging(s, "image", (2, 3), torch.float32)
    smaller = ring.staging(s, "image", (1, 3), torch.float32)
    assert smaller.data_ptr() == a.data_ptr() and smaller.shape == (1, 3)
    bigger = ring.staging(s, "image", (4, 3), torch.float32)
    assert bigger.shape == (4, 3) and s.buffers["image"].numel() == 12
    as_int = ring.staging(s, "image", (4, 3), torch.int64)
    assert as_int.dtype == torch.int64 and s.buffers["image"].dtype == torch.int64
    ring.staging(ring.slot(), "image", (4, 3), torch.int64)
    ring.staging(ring.slot(), "image", (2, 3), torch.int64)  # back to slot 0: reuses, does not grow
    assert ring.pinned_bytes == 2 * 12 * 8  # depth x the largest batch


def test_cpu_upload_hands_over_the_host_tensors_and_counts_copies() -> None:
    ring = PinnedRing("cpu", depth=2)
    host = {"image": torch.ones(2, 3), "label": torch.arange(2)}
    for n in (1, 2, 3):
        s = ring.slot()
        out = ring.upload(s, host)
        assert out is not host and out.keys() == host.keys()
        assert all(out[k] is host[k] for k in host)
        assert isinstance(s.event, NullEvent) and s.event.query()
        assert ring.copies == n
    assert ring.upload(ring.slot(), {}) == {} and ring.copies == 4


def test_null_stream_and_event_are_no_ops() -> None:
    stream, event = NullStream(), NullEvent()
    stream.wait_stream(NullStream())  # ordering is program order: nothing to wait for
    stream.synchronize()
    event.record(stream)
    event.record()
    event.synchronize()
    assert event.query() is True  # always complete
    assert isinstance(PinnedRing("cpu").stream, NullStream)
    entered = False
    with on_stream(stream):
        entered = True
    assert entered


def test_loader_cpu_batches_do_not_alias_each_other(small_spec: dict, shards: list[str]) -> None:
    loader = feedfast.DataLoader(small_spec, shards=shards, num_workers=2, prefetch_factor=1)
    assert len(loader.ring.slots) == 2  # six batches go round the ring three times
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    for images, labels in loader:
        kept.append((images, labels))
        copies.append((images.clone(), labels.clone()))
    assert len(kept) == 6 and loader.ring.copies == 6
    for (images, labels), (x, y) in zip(kept, copies):
        assert images.device.type == "cpu"
        assert torch.equal(images, x) and torch.equal(labels, y)
    ptrs = [images.data_ptr() for images, _ in kept]
    assert len(set(ptrs)) == len(ptrs)
    assert loader.ring.pinned_bytes == 0
