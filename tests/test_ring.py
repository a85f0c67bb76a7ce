"""The pinned prefetch ring's logic on the CPU, through the same code path CUDA takes.

The CUDA ordering is checked with a stand-in device layer (``tests.helpers.FakeGpu``) that logs
every stream operation: the copy runs on a side stream that never waits for the training
stream, the training stream waits for each batch's event, and a slot is reused only after its
event completed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

import feedfast
from feedfast.errors import UserError
from feedfast.loader.devices import HostLayer, Route
from feedfast.loader.ring import NullEvent, NullStream, PinnedRing
from tests.helpers import FakeGpu


class CountingEvent:
    """An event that reports "still running" for its first ``pending`` queries."""

    def __init__(self, pending: int = 2) -> None:
        self.queries, self.pending = 0, pending

    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        raise AssertionError("the ring must poll, not synchronize")

    def query(self) -> bool:
        self.queries += 1
        return self.queries > self.pending


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
    first.event = CountingEvent(pending=2)
    ring.slot()
    assert first.event.queries == 0  # the other slot: no wait
    assert ring.slot() is first and first.event.queries == 3 and ring.waits == 1


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
        ready = ring.upload(s, host)
        out = ring.hand_over(ready)
        assert out is not host and out.keys() == host.keys()
        assert all(out[k] is host[k] for k in host)
        assert isinstance(s.event, NullEvent) and s.event.query()
        assert ring.copies == n
    assert ring.upload(ring.slot(), {}).tensors == {} and ring.copies == 4


def test_null_stream_and_event_are_no_ops() -> None:
    stream, event = NullStream(), NullEvent()
    stream.wait_stream(NullStream())  # ordering is program order: nothing to wait for
    stream.wait_event(event)
    stream.synchronize()
    event.record(stream)
    event.record()
    event.synchronize()
    assert event.query() is True  # always complete
    assert isinstance(PinnedRing("cpu").stream, NullStream)
    assert isinstance(PinnedRing("cpu").layer, HostLayer)


def test_copy_runs_on_the_side_stream_and_never_waits_for_the_training_stream() -> None:
    gpu = FakeGpu()
    ring = PinnedRing("cuda", depth=2, layer=gpu)
    for step in range(3):
        s = ring.slot()
        staged = ring.staging(s, "image", (2, 3), torch.uint8).fill_(step)
        ready = ring.upload(s, {"image": staged}, on_device=lambda f: {k: v.float() for k, v in f.items()})
        out = ring.hand_over(ready)
        assert torch.equal(out["image"], torch.full((2, 3), float(step)))
    side = ring.stream.name
    assert not any(op[0] in ("wait_stream", "synchronize", "host_sync") for op in gpu.log), gpu.log
    copies = [op for op in gpu.log if op[0] == "copy"]
    assert len(copies) == 3 and all(op[1] == side for op in copies)
    records = [op for op in gpu.log if op[0] == "record"]
    waits = [op for op in gpu.log if op[0] == "wait_event"]
    assert [r[1] for r in records] == [side] * 3
    assert [(w[1], w[2]) for w in waits] == [("training", r[2]) for r in records]  # each batch's own event
    assert [op for op in gpu.log if op[0] == "keep"] == [("keep", "training")] * 3


def test_a_slot_is_not_reused_before_its_copy_completes() -> None:
    gpu = FakeGpu(auto=False)  # copies stay "in flight" until gpu.complete()
    ring = PinnedRing("cuda", depth=2, layer=gpu)
    taken: list[Any] = []

    def producer() -> None:
        for _ in range(3):
            s = ring.slot()
            ring.upload(s, {"x": ring.staging(s, "x", (4,), torch.float32).fill_(1)})
            taken.append(s)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    time.sleep(0.3)
    assert len(taken) == 2 and thread.is_alive()  # the third batch needs slot 0, whose copy still runs
    gpu.complete(upto=1)
    thread.join(timeout=5)
    assert len(taken) == 3 and taken[2] is taken[0] and ring.waits == 1
    assert not any(op[0] in ("host_sync", "synchronize") for op in gpu.log)  # polled, never synchronized


def test_drain_waits_for_every_copy_without_synchronizing() -> None:
    gpu = FakeGpu(auto=False)
    ring = PinnedRing("cuda", depth=2, layer=gpu)
    ring.upload(ring.slot(), {"x": torch.ones(2)})
    threading.Timer(0.2, gpu.complete).start()
    t0 = time.perf_counter()
    ring.drain()
    assert time.perf_counter() - t0 >= 0.15 and all(e.done for e in gpu.events)
    assert not any(op[0] in ("host_sync", "synchronize") for op in gpu.log)


def _fake_cuda_loader(monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu, spec: dict, shards: list[str],
                      **kw: Any) -> feedfast.DataLoader:
    """A loader that believes it delivers to cuda:0 through ``gpu`` (a CPU pipeline, the pinned-ring path)."""
    import feedfast.loader.dataloader as dl

    monkeypatch.setattr(dl, "route_here", lambda placement, device: Route("cpu", torch.device("cuda", 0), None))
    monkeypatch.setattr(dl.DataLoader, "_layer", lambda self: gpu)
    return feedfast.DataLoader(spec, shards=shards, num_workers=2, **kw)


def test_loader_to_cuda_orders_every_batch_on_the_side_stream(monkeypatch: pytest.MonkeyPatch, small_spec: dict,
                                                               shards: list[str]) -> None:
    reference = [(x.clone(), y.clone()) for x, y in feedfast.DataLoader(small_spec, shards=shards, num_workers=2)]
    gpu = FakeGpu()
    loader = _fake_cuda_loader(monkeypatch, gpu, small_spec, shards)
    assert any(n.op == "normalize" and n.deferred for n in loader.plan.nodes)  # uint8 over the bus
    got = [(x, y) for x, y in loader]
    assert len(got) == len(reference) == 6
    for (x, y), (rx, ry) in zip(got, reference):
        assert torch.equal(y, ry)
        torch.testing.assert_close(x, rx, atol=1e-4, rtol=1e-5)  # normalized after the copy, as DALI does
    side = loader.ring.stream.name
    assert not any(op[0] in ("wait_stream", "synchronize", "host_sync") for op in gpu.log)
    assert {op[1] for op in gpu.log if op[0] == "copy"} == {side}
    assert len([op for op in gpu.log if op[0] == "wait_event" and op[1] == "training"]) == 6


def test_the_next_batches_are_made_while_the_consumer_holds_one(monkeypatch: pytest.MonkeyPatch, small_spec: dict,
                                                                 shards: list[str]) -> None:
    """Staging and copies run on the loader's thread during the step, not inside ``next()``."""
    gpu = FakeGpu()
    loader = _fake_cuda_loader(monkeypatch, gpu, small_spec, shards, prefetch_factor=2)
    it = iter(loader)
    next(it)
    deadline = time.monotonic() + 10
    while loader.ring.copies < 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # the "training step": the consumer does not call next()
    # batch 0 in hand, batches 1 and 2 copied and queued (prefetch_factor=2), batch 3 made and waiting to queue
    assert loader.ring.copies == 4
    before = loader.ring.copies
    time.sleep(0.2)
    assert loader.ring.copies == before  # bounded: no more than prefetch_factor batches ahead
    rest = list(it)
    assert len(rest) == 5 and loader.ring.copies == 6
    it2 = iter(loader)
    next(it2)
    thread = loader._producer._thread  # type: ignore[union-attr]
    assert thread is not threading.current_thread() and thread.name.startswith("feedfast-rank0")
    loader.close()


def test_loader_cpu_batches_do_not_alias_each_other(small_spec: dict, shards: list[str]) -> None:
    loader = feedfast.DataLoader(small_spec, shards=shards, num_workers=2, prefetch_factor=1)
    assert len(loader.ring.slots) == 3  # six batches go round the ring twice
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
