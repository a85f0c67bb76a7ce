"""Moving host batches to the consumer's device through a bounded ring of pinned buffers.

On CUDA, each host tensor is staged into a pinned slot and copied on a side stream; the
training (current) stream waits only for that copy, the device tensor is marked with
``record_stream`` so its memory is not reused early, and a slot is reused only after its
copy finished (an event). On the CPU the same code runs with a no-op stream and event,
and tensors are handed over as they are.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from feedfast.errors import UserError


class NullStream:
    """A stand-in for ``torch.cuda.Stream`` on the CPU: ordering is program order."""

    def wait_stream(self, other: Any) -> None:  # noqa: D102 - mirrors torch's API
        return None

    def synchronize(self) -> None:  # noqa: D102
        return None


class NullEvent:
    """A stand-in for ``torch.cuda.Event`` on the CPU: always complete."""

    def record(self, stream: Any = None) -> None:  # noqa: D102
        return None

    def synchronize(self) -> None:  # noqa: D102
        return None

    def query(self) -> bool:  # noqa: D102
        return True


@dataclass
class _Slot:
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    event: Any = None
    uses: int = 0


class PinnedRing:
    """A fixed number of staging slots for host-to-device copies.

    Args:
        device: the consumer's device (``cpu`` or ``cuda[:n]``).
        depth: number of slots; bounds pinned memory to ``depth`` batches.
        pin: allocate staging buffers in page-locked memory (ignored on the CPU).
    """

    def __init__(self, device: str | torch.device = "cpu", depth: int = 2, pin: bool = True) -> None:
        if depth < 1:
            raise UserError(f"prefetch depth must be >= 1, got {depth}")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pin = pin and self.cuda
        self.slots = [_Slot() for _ in range(depth)]
        self.next = 0
        self.stream: Any = torch.cuda.Stream(self.device) if self.cuda else NullStream()
        self.copies = 0

    @property
    def pinned_bytes(self) -> int:
        """Bytes of staging memory held (pinned on CUDA)."""
        return sum(t.numel() * t.element_size() for s in self.slots for t in s.buffers.values())

    def slot(self) -> _Slot:
        """The next slot, after its previous copy finished."""
        s = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        if s.event is not None:
            s.event.synchronize()
        s.uses += 1
        return s

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
            buf = torch.empty(numel, dtype=dtype, pin_memory=self.pin)
            s.buffers[name] = buf
        return buf[:numel].view(shape)

    def upload(self, s: _Slot, host: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copy a slot's host tensors to the device; the current stream waits for the copy."""
        if not self.cuda:
            s.event = NullEvent()
            s.event.record(self.stream)
            self.copies += 1
            return dict(host)
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)  # the slot's memory may still be read by old work
        with torch.cuda.stream(self.stream):
            out = {k: v.to(self.device, non_blocking=True) for k, v in host.items()}
            s.event = torch.cuda.Event()
            s.event.record(self.stream)
        current.wait_stream(self.stream)
        for t in out.values():
            t.record_stream(current)
        self.copies += 1
        return out


@contextlib.contextmanager
def on_stream(stream: Any) -> Iterator[None]:
    """``torch.cuda.stream(stream)`` on CUDA, nothing on the CPU."""
    if isinstance(stream, NullStream):
        yield
    else:
        with torch.cuda.stream(stream):
            yield
