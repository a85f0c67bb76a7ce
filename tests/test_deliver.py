"""The delivery stage: one owner of every batch from a backend to the training step, for every backend.

Run against the stand-in device layer (tests/helpers.py's FakeGpu), whose events stay pending
until told: a backend's device outputs are copied on the side stream, the backend is asked for
its next batch only once those copies finished, every copy is done before the backend's iterator
is closed, host tensors are staged and copied, the deferred normalize runs on the side stream
after the copy, and the hand-over orders the training stream after the batch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import torch

from feedfast.loader.batch import Batch, Pending
from feedfast.loader.deliver import Delivery
from feedfast.ops.color import normalize_tensor
from tests.helpers import FakeGpu

NORMALIZE = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "layout": "CHW", "dtype": "float32"}


@dataclass
class DeviceOutput:
    """A stand-in for a DALI GPU output: its copy is logged on the stream it is queued on."""

    gpu: FakeGpu
    value: torch.Tensor
    on_device: bool = True

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.value.dtype

    def write(self, out: torch.Tensor, stream: Any) -> torch.Tensor:
        self.gpu.log.append(("device_copy", stream.name if stream is not None else "host"))
        return out.copy_(self.value)

    def to_host(self) -> "DeviceOutput":
        return DeviceOutput(self.gpu, self.value, on_device=False)


def _pixels(n: int = 2) -> torch.Tensor:
    return torch.arange(n * 4 * 4 * 3, dtype=torch.int64).remainder(256).to(torch.uint8).view(n, 4, 4, 3)


def _delivery(gpu: FakeGpu, **kw: Any) -> Delivery:
    return Delivery(gpu, depth=3, pin=True, deferred=kw.pop("deferred", {}), outputs=("image", "label"),  # type: ignore[arg-type]
                    form="tuple", **kw)


def test_a_dali_output_is_pending_and_a_host_tensor_is_not() -> None:
    assert isinstance(DeviceOutput(FakeGpu(), _pixels()), Pending)
    assert not isinstance(_pixels(), Pending)


def test_device_outputs_are_copied_on_the_side_stream_and_the_backend_waits_for_the_copy() -> None:
    gpu = FakeGpu(auto=False)
    delivery = _delivery(gpu)
    asked: list[int] = []

    def backend() -> Iterator[Batch]:
        for step in range(3):
            asked.append(step)
            yield Batch({"image": DeviceOutput(gpu, _pixels()), "label": torch.tensor([step, step])},
                        [("s", f"k{step}")] * 2, 2)

    staged = delivery.stage(backend())
    first = next(staged)
    assert ("device_copy", delivery.ring.stream.name) in gpu.log
    asked_then = list(asked)
    done = threading.Event()

    def take_next() -> None:
        next(staged)
        done.set()

    taker = threading.Thread(target=take_next, daemon=True)
    taker.start()
    assert not done.wait(0.2), "the backend was asked for its next batch before its device copy finished"
    assert asked == asked_then == [0]
    gpu.complete()
    assert done.wait(5) and asked == [0, 1]
    taker.join()
    out = delivery.hand_over(first)
    assert torch.equal(out[0], _pixels()) and out[1].tolist() == [0, 0]
    assert ("wait_event", "training", first.event.id) in gpu.log
    gpu.complete()  # the second batch's copies, queued after the first complete()
    staged.close()


def test_every_copy_is_done_before_the_backends_iterator_is_closed() -> None:
    gpu = FakeGpu(auto=False)
    delivery = _delivery(gpu)
    seen_at_close: list[bool] = []

    def backend() -> Iterator[Batch]:
        try:
            while True:
                yield Batch({"image": _pixels(), "label": torch.tensor([0, 1])}, [("s", "k")] * 2, 2)
        finally:
            seen_at_close.append(all(e.done for e in gpu.events))

    staged = delivery.stage(backend())
    next(staged)
    closer = threading.Thread(target=staged.close, daemon=True)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and not seen_at_close  # the side stream still copies: the backend stays open
    gpu.complete()
    closer.join(5)
    assert seen_at_close == [True]


def test_host_tensors_are_staged_copied_and_normalized_after_the_copy_on_the_side_stream() -> None:
    gpu = FakeGpu()
    delivery = _delivery(gpu, deferred={"image": NORMALIZE})
    pixels = _pixels()
    staged = delivery.stage(iter([Batch({"image": pixels, "label": torch.tensor([3, 4]), "key": ["a", "b"]},
                                        [("s", "a"), ("s", "b")], 2)]))
    delivered = next(staged)
    side = delivery.ring.stream.name
    assert [entry[:2] for entry in gpu.log if entry[0] == "copy"] == [("copy", side), ("copy", side)]
    assert torch.equal(delivered.fields["image"], normalize_tensor(pixels, NORMALIZE))
    assert delivered.fields["key"] == ["a", "b"]  # host values are delivered as they are
    assert list(staged) == []


def test_a_gpu_output_asked_for_on_the_cpu_is_copied_to_the_host_first() -> None:
    from feedfast.loader.devices import HostLayer

    gpu = FakeGpu()
    delivery = Delivery(HostLayer(), depth=2, pin=True, deferred={}, outputs=("image",),
                        form="dict")
    delivered = next(delivery.stage(iter([Batch({"image": DeviceOutput(gpu, _pixels())}, [("s", "k")] * 2, 2)])))
    assert ("device_copy", "host") in gpu.log
    assert torch.equal(delivery.hand_over(delivered)["image"], _pixels())


@pytest.mark.parametrize("skip", [0, 2])
def test_batches_made_again_for_a_resume_are_dropped_unread(skip: int) -> None:
    gpu = FakeGpu()
    delivery = _delivery(gpu)
    made = [Batch({"image": _pixels(), "label": torch.tensor([i, i])}, [("s", f"k{i}")] * 2, 2) for i in range(4)]
    out = [d.fields["label"][0].item() for d in delivery.stage(iter(made), skip=skip)]
    assert out == list(range(skip, 4))
    assert delivery.ring.copies == 4 - skip


def test_the_hook_runs_on_the_side_stream_and_the_hand_over_waits_for_it() -> None:
    gpu = FakeGpu()
    streams: list[str] = []

    def hook(batch: Any) -> Any:
        streams.append(gpu.active)
        image, label = batch
        return image.float() * 2, label

    delivery = _delivery(gpu, hook=hook)
    delivered = next(delivery.stage(iter([Batch({"image": _pixels(), "label": torch.tensor([1, 2])},
                                                [("s", "k")] * 2, 2)])))
    assert streams == [delivery.ring.stream.name]
    image, label = delivery.hand_over(delivered)
    assert torch.equal(image, _pixels().float() * 2) and label.tolist() == [1, 2]
    assert ("wait_event", "training", delivered.event.id) in gpu.log
