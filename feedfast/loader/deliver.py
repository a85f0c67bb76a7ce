"""The delivery stage: the one owner of every batch between the backend that makes it and the user.

Every backend yields :class:`~feedfast.loader.batch.Batch` objects of host tensors, host
values or :class:`~feedfast.loader.batch.Pending` outputs (a DALI pipeline's, on the host or
the GPU) and never sees what follows. This stage, on the producer thread
(:mod:`feedfast.loader.producer`), for every backend alike:

1. binds the thread to the delivery device before any CUDA call (:meth:`Delivery.bind_thread`;
   a new thread's current device is 0, and every rank but the first would open a context there);
2. stages host tensors in a slot of the pinned ring and copies them on the side stream
   (:mod:`feedfast.loader.ring`); device outputs are copied out of the backend's memory on the
   same stream, and the backend is asked for its next batch only once those copies finished
   (so a backend may reuse or free its memory as soon as it is asked again);
3. runs the deferred ``normalize`` of the cheap-transfer pass on the device after the uint8 copy
   (:meth:`Delivery.normalize`: the one place the torch side does that arithmetic);
4. runs the batch hook (``collate_fn=``) on the side stream, after the copy;

and, on the training thread, hands the batch over (:meth:`Delivery.hand_over`): the training
stream waits for the batch's event, its tensors are kept from reuse while that stream reads
them, and the batch is shaped as the spec's outputs. On the CPU the same code runs with no-op
streams and events (:class:`~feedfast.loader.devices.HostLayer`).

A change to how batches reach the GPU is a change to this module (and the ring it owns).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from feedfast.loader.batch import Batch, BatchInfo, Pending, shape_outputs
from feedfast.loader.batchhook import BatchHook, run_batch_hook, tensors_of, with_info
from feedfast.loader.devices import DeviceLayer, NullEvent
from feedfast.loader.ring import PinnedRing, Ready
from feedfast.ops.color import normalize_tensor

_NOT_HOOKED = object()


@dataclass
class Delivered:
    """A batch on its way to the user: every field after the upload, ready once ``event`` fired.

    Attributes:
        batch: the backend's batch (origins, valid count, checkpoint).
        fields: every output by name: tensors on the delivery device, host values.
        event: recorded on the side stream after the batch's last work there.
        hooked: what ``collate_fn`` returned, yielded in place of the shaped fields (else a sentinel).
    """

    batch: Batch
    fields: dict[str, Any]
    event: Any
    hooked: Any = field(default=_NOT_HOOKED)

    def tensors(self) -> list[torch.Tensor]:
        """The tensors the training stream will read: the hook's result's, or the fields'."""
        return list(tensors_of(self.fields if self.hooked is _NOT_HOOKED else self.hooked))


class Delivery:
    """The pinned ring, the side stream, the deferred normalize and the hand-over, for every backend.

    Args:
        layer: the delivery device's layer (``torch.cuda`` for CUDA, no-ops for the CPU; tests
            pass a stand-in with several devices).
        depth: slots of the ring (the batches made ahead, the one being made, and a spare).
        pin: stage host tensors in page-locked memory (CUDA only).
        deferred: the outputs whose ``normalize`` the plan left to the consumer's device, with
            its parameters (:meth:`~feedfast.compile.plan.Plan.deferred_outputs`).
        outputs, form: the spec's outputs and their form (``tuple`` or ``dict``), for the hand-over.
        hook: the batch hook (``collate_fn=``), or None.
    """

    def __init__(self, layer: DeviceLayer, *, depth: int, pin: bool, deferred: dict[str, dict[str, Any]],
                 outputs: tuple[str, ...], form: str, hook: BatchHook | None = None) -> None:
        self.ring = PinnedRing(layer.device, depth=depth, pin=pin, layer=layer)
        self.layer = layer
        self.deferred = deferred
        self.outputs, self.form, self.hook = outputs, form, hook

    def bind_thread(self) -> None:
        """Make the delivery device the calling thread's current device (the producer's first call)."""
        self.layer.bind_thread()

    def stage(self, batches: Iterator[Batch], *, skip: int = 0, hooked: bool = True,
              where: Callable[[int], str] = str,
              mix: Callable[[Delivered, PinnedRing, int], None] | None = None) -> Iterator[Delivered]:
        """Producer side: each batch of ``batches`` uploaded (the first ``skip`` dropped unread: a resume
        makes again the batches from its checkpoint to its step), hooked when ``hooked``.

        ``where(i)`` names the ``i``-th batch yielded in a hook's error; ``mix(delivered, ring, i)`` (the
        spec's ``batch.mix``, :mod:`feedfast.loader.batchmix_stage`) runs on the ``i``-th before the hook. Closing this generator
        finishes every copy on the side stream before it closes ``batches``, so a backend
        releases nothing the stream still reads.
        """
        try:
            count = 0
            for batch in batches:
                if skip > 0:
                    skip -= 1
                    continue
                delivered, copied = self.upload(batch)
                if mix is not None:
                    mix(delivered, self.ring, count)
                if hooked and self.hook is not None:
                    self._hook(delivered, where(count))
                count += 1
                yield delivered
                self.ring.wait(copied)  # the backend's memory is free before it is asked for more
        finally:
            self.ring.drain()
            close = getattr(batches, "close", None)
            if callable(close):
                close()

    def upload(self, batch: Batch) -> tuple[Delivered, Any]:
        """One batch's fields staged and copied on the side stream, deferred normalize after the copy.

        Returns the delivered batch and the event after the copies out of the backend's memory
        (None when no device output was read there).
        """
        slot = self.ring.slot()
        cuda = self.ring.cuda
        host: dict[str, torch.Tensor] = {}
        on_device: dict[str, Pending] = {}
        kept: dict[str, Any] = {}
        for name, value in batch.fields.items():
            if isinstance(value, torch.Tensor):
                host[name] = self.ring.staging(slot, name, tuple(value.shape), value.dtype).copy_(value) \
                    if cuda else value
            elif isinstance(value, Pending):
                if value.on_device and not cuda:
                    value = value.to_host()  # a GPU pipeline's output asked for on the CPU
                if value.on_device:
                    on_device[name] = value
                else:
                    host[name] = value.write(self.ring.staging(slot, name, value.shape, value.dtype), None)
            else:
                kept[name] = value

        def device_fields() -> dict[str, torch.Tensor]:
            return {name: out.write(self.layer.empty(out.shape, out.dtype), self.ring.stream)
                    for name, out in on_device.items()}

        ready = self.ring.upload(slot, host, on_device=self.normalize if self.deferred else None,
                                 device_fields=device_fields if on_device else None)
        return Delivered(batch, {**ready.tensors, **kept}, ready.event), ready.copied

    def normalize(self, fields: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The cheap-transfer pass's ``normalize`` of the deferred outputs, on the side stream after the copy."""
        for name, params in self.deferred.items():
            fields[name] = normalize_tensor(fields[name], params)
        return fields

    def _hook(self, delivered: Delivered, where: str) -> None:
        """``collate_fn`` over the shaped batch, on the side stream; the batch's event then follows it."""
        assert self.hook is not None
        shaped = shape_outputs(delivered.fields, self.outputs, self.form)
        with self.layer.on(self.ring.stream):
            delivered.hooked = run_batch_hook(self.hook, shaped, len(delivered.batch.origins), where)
            event = self.layer.new_event() if self.ring.cuda else NullEvent()
            event.record(self.ring.stream)
        delivered.event = event

    def hand_over(self, delivered: Delivered, info: BatchInfo | None = None) -> Any:
        """Consumer side: the training stream waits for the batch, its tensors are kept from reuse while that
        stream reads them, and the batch is returned as the user gets it (``info`` added when given)."""
        self.ring.hand_over(Ready({str(i): t for i, t in enumerate(delivered.tensors())}, delivered.event))
        if delivered.hooked is not _NOT_HOOKED:
            return with_info(delivered.hooked, info)
        return shape_outputs(delivered.fields, self.outputs, self.form, info)
