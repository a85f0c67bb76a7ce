"""Moving batches to the consumer's device through a bounded ring of pinned buffers.

Two sides, two threads:

- the producer (the loader's background thread, :mod:`feedfast.loader.producer`) takes a slot
  (:meth:`PinnedRing.slot`, which waits until that slot's previous copy finished), stages host
  tensors into it, and :meth:`PinnedRing.upload` copies them on a side stream and records a
  ``ready`` event there. The side stream never waits for the training stream: the copy of
  batch N+k runs while step N runs;
- the consumer (the training thread) calls :meth:`PinnedRing.hand_over` on a ready batch: the
  training (current) stream waits for the ``ready`` event, and each device tensor is marked with
  ``record_stream`` so the caching allocator does not reuse its memory while the training
  stream may still read it. No host synchronization happens on either side: a slot's reuse
  polls its event (``query``) instead of synchronizing.

On the CPU the same code runs through :class:`~feedfast.loader.devices.HostLayer`: no-op streams
and events, and tensors handed over as they are. Tests pass a stand-in layer that records the
order of stream operations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from feedfast.errors import UserError
from feedfast.loader.devices import DeviceLayer, NullEvent, NullStream, layer_for

__all__ = ["NullEvent", "NullStream", "PinnedRing", "Ready"]


@dataclass
class _Slot:
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    event: Any = None
    uses: int = 0


@dataclass
class Ready:
    """Device tensors of one batch and the event that marks them ready on the side stream."""

    tensors: dict[str, torch.Tensor]
    event: Any
    copied: Any = None  # recorded after the copies of device outputs, before the work on them (None: none)


class PinnedRing:
    """A fixed number of staging slots for host-to-device copies, and the side stream they run on.

    Args:
        device: the consumer's device (``cpu`` or ``cuda:N``).
        depth: number of slots; bounds pinned memory to ``depth`` batches.
        pin: allocate staging buffers in page-locked memory (ignored on the CPU).
        layer: the device layer (default: ``torch.cuda`` for CUDA, no-ops for the CPU).
    """

    def __init__(self, device: str | torch.device = "cpu", depth: int = 2, pin: bool = True,
                 layer: DeviceLayer | None = None) -> None:
        if depth < 1:
            raise UserError(f"prefetch depth must be >= 1, got {depth}")
        self.layer: DeviceLayer = layer if layer is not None else layer_for(torch.device(device))
        self.device = self.layer.device
        self.cuda = self.layer.cuda
        self.pin = pin and self.cuda
        self.slots = [_Slot() for _ in range(depth)]
        self.next = 0
        self.stream: Any = self.layer.new_stream()
        self.copies = 0
        self.waits = 0  # times the producer found a slot's previous copy still running

    @property
    def pinned_bytes(self) -> int:
        """Bytes of staging memory held (pinned on CUDA)."""
        return sum(t.numel() * t.element_size() for s in self.slots for t in s.buffers.values())

    def slot(self) -> _Slot:
        """The next slot, once its previous copy finished (polled: no host synchronization)."""
        s = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        if s.event is not None and not s.event.query():
            self.waits += 1
            pause = 5e-5
            while not s.event.query():
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
        s.uses += 1
        return s

    def drain(self) -> None:
        """Wait until every copy on the side stream finished (polled, from the producer thread)."""
        for s in self.slots:
            self.wait(s.event)

    @staticmethod
    def wait(event: Any) -> None:
        """Wait until ``event`` (None: nothing) has fired, polled with ``query``: no host synchronization."""
        pause = 5e-5
        while event is not None and not event.query():
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def staging(self, s: _Slot, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host buffer of ``shape`` in slot ``s`` (reallocated when it is too small).

        Without CUDA the batch itself is handed to the user, so each call gives a fresh
        tensor instead of a reused one.
        """
        if not self.cuda:
            return torch.empty(shape, dtype=dtype)
        numel = 1
        for d in shape:
            numel *= d
        buf = s.buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            buf = self.layer.host_buffer(numel, dtype, self.pin)
            s.buffers[name] = buf
        return buf[:numel].view(shape)

    def upload(self, s: _Slot, host: dict[str, torch.Tensor],
               on_device: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
               device_fields: Callable[[], dict[str, torch.Tensor]] | None = None) -> Ready:
        """Copy a slot's host tensors on the side stream (producer side); nothing waits for the training stream.

        Args:
            s: the slot the host tensors were staged in.
            host: host tensors to copy.
            on_device: work on the copied tensors, run on the side stream after the copy
                (normalization of the cheap-transfer pass).
            device_fields: makes tensors that are already on the device (a GPU pipeline's
                outputs), called on the side stream so their copies are ordered there; the
                returned ``Ready.copied`` fires once they are done.
        """
        with self.layer.on(self.stream):
            out = {k: self.layer.copy_in(v) for k, v in host.items()}
            copied = None
            if device_fields is not None:
                out.update(device_fields())
                if self.cuda:
                    copied = self.layer.new_event()
                    copied.record(self.stream)
            if on_device is not None:
                out = on_device(out)
            event = self.layer.new_event() if self.cuda else NullEvent()
            event.record(self.stream)
        s.event = event
        self.copies += 1
        return Ready(out, event, copied)

    def hand_over(self, ready: Ready) -> dict[str, torch.Tensor]:
        """Consumer side: order the training stream after the batch's copy and protect its memory."""
        if not self.cuda:
            return ready.tensors
        current = self.layer.current_stream()
        current.wait_event(ready.event)
        for t in ready.tensors.values():
            if isinstance(t, torch.Tensor):
                self.layer.keep_for(t, current)
        return ready.tensors
