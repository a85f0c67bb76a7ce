"""Timing events: how the meter sees the GPU timeline.

The meter records two events per step on the training stream:

* ``A_i`` when the loop asks for the next batch (step i's work is all enqueued);
* ``B_i`` right after ``next()`` returns (the batch is in hand and anything the
  loader ordered on the stream, such as its copy, is ahead of ``B_i``).

An event completes when the GPU reaches it, so, with ``t_req`` and ``t_ready`` the
host times of the two records and ``D`` the time the stream drains step i's work::

    time(A_i) = max(t_req, D)          time(B_i) = max(t_ready, D)
    elapsed(A_i, B_i) = max(0, t_ready - max(t_req, D))

That is exactly the GPU's idle time inside the data wait:

* the GPU still busy when the batch arrives (``D >= t_ready``): 0, the wait was hidden;
* the GPU drained during the wait (``t_req < D < t_ready``): ``t_ready - D``;
* the GPU drained before the wait (``D <= t_req``, e.g. the step synchronized): the
  whole host wait. GPU idle *before* ``t_req`` belongs to the step (host-bound code,
  syncs), not to the data, and is not counted.

Events are read lazily with ``query()``; the meter never synchronizes.

Anything that follows :class:`TimingEvent` and :class:`EventFactory` can stand in for
CUDA events: :class:`feedfast.meter.clock.SimulatedGpu` runs the same logic on a CPU.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from feedfast.errors import UserError

GPU_BASIS = "gpu-events"
HOST_BASIS = "host-wait"


@runtime_checkable
class TimingEvent(Protocol):
    """One point on a device timeline."""

    def record(self) -> None:
        """Enqueue the event on the stream it belongs to."""

    def query(self) -> bool:
        """Return True once the device has reached the event (never blocks)."""

    def elapsed_ms(self, end: TimingEvent) -> float:
        """Milliseconds from this event to ``end`` on the device timeline."""


@runtime_checkable
class EventFactory(Protocol):
    """Makes events; ``describe`` says what timeline they measure."""

    def __call__(self) -> TimingEvent:
        """Return a new, unrecorded event."""

    def describe(self) -> str:
        """A short human description, e.g. ``"cuda:0 current stream"``."""


class _CudaEvent:
    """A ``torch.cuda.Event`` recorded on a fixed stream, or the current one."""

    __slots__ = ("_cuda", "_device", "_event", "_stream")

    def __init__(self, stream: Any, device: Any) -> None:
        import torch

        self._cuda = torch.cuda
        self._event = torch.cuda.Event(enable_timing=True)
        self._stream = stream
        self._device = device

    def record(self) -> None:
        if self._stream is not None:
            self._event.record(self._stream)
        elif self._device is not None:
            self._event.record(self._cuda.current_stream(self._device))
        else:
            self._event.record()

    def query(self) -> bool:
        return bool(self._event.query())

    def elapsed_ms(self, end: TimingEvent) -> float:
        if not isinstance(end, _CudaEvent):
            raise TypeError(f"cannot time a CUDA event against {type(end).__name__}")
        return float(self._event.elapsed_time(end._event))


class CudaEvents:
    """CUDA timing events on the training stream.

    Args:
        stream: The ``torch.cuda.Stream`` the training step runs on. ``None`` (the
            default) records on whatever stream is current at each record, which is
            the training stream for ordinary loops.
        device: The CUDA device whose current stream is used when ``stream`` is
            None; ``None`` means the current device.

    Raises:
        UserError: CUDA is not available.
    """

    def __init__(self, *, stream: Any = None, device: Any = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise UserError(
                "CudaEvents needs CUDA, and torch.cuda.is_available() is False; "
                "fix: use StallMeter(device='cpu') to measure host wait"
            )
        self._stream = stream
        self._device = torch.device(device) if device is not None else None

    @property
    def device(self) -> Any:
        """The ``torch.device`` whose current stream the events are recorded on (None: the current device)."""
        return self._device

    def __call__(self) -> TimingEvent:
        """Return a new, unrecorded CUDA event."""
        return _CudaEvent(self._stream, self._device)

    def describe(self) -> str:
        """Say which device and stream the events are recorded on."""
        where = str(self._device) if self._device is not None else "cuda"
        stream = "current stream" if self._stream is None else "given stream"
        return f"{where} {stream}"


def resolve_events(device: str | None, events: EventFactory | None) -> EventFactory | None:
    """Pick the event factory for a meter.

    Args:
        device: ``"auto"`` (CUDA events when CUDA is available), ``"cpu"``/``None``
            (host wait only), or ``"cuda"``/``"cuda:N"`` (CUDA events, required).
            ``auto`` and ``cuda`` mean the rank's GPU by feedfast.DataLoader's rule
            (:func:`~feedfast._env.rank_cuda_device`: ``cuda:{LOCAL_RANK}`` under
            torchrun, else the current device), so the events are recorded on the stream the
            loader delivers to even when the script never called ``set_device``.
        events: An explicit factory; wins over ``device``.

    Returns:
        The factory, or None for host-wait measurement.

    Raises:
        UserError: ``device`` is not one of the forms above, or asks for CUDA
            that is not there.
    """
    if events is not None:
        if not isinstance(events, EventFactory):
            raise UserError(
                f"StallMeter: events must be an EventFactory (callable with describe()), "
                f"got {type(events).__name__}; fix: pass CudaEvents() or SimulatedGpu()"
            )
        return events
    if device is None or device == "cpu":
        return None
    if not isinstance(device, str) or not (
        device in ("auto", "cuda") or device.startswith("cuda:")
    ):
        raise UserError(
            f"StallMeter: device got {device!r}; allowed: 'auto', 'cpu', 'cuda', 'cuda:N'"
        )
    from feedfast._env import rank_cuda_device

    if device.startswith("cuda:"):
        return CudaEvents(device=device)
    rank_device = rank_cuda_device()
    if rank_device is None:
        if device == "auto":
            return None
        return CudaEvents()  # raises: CUDA was asked for and is not there
    return CudaEvents(device=rank_device)


def gpu_index(events: EventFactory | None) -> int | None:
    """The CUDA index of the GPU a meter with these events measures, for its NVML sampler.

    The events' device when they are :class:`CudaEvents` on a known device, else the rank's
    GPU by the loader's rule, else None (no CUDA: NVML then samples CUDA device 0, if any).
    """
    device = events.device if isinstance(events, CudaEvents) else None
    if device is None:
        from feedfast._env import rank_cuda_device

        device = rank_cuda_device()
    return None if device is None else int(device.index or 0)


def basis_note(events: EventFactory | None) -> str:
    """Say, for a summary, what the meter's waits measure."""
    if events is None:
        return "time inside next() on the host (no CUDA events in use)"
    return f"GPU idle inside data waits, from events on {events.describe()}"


def basis_of(events: EventFactory | None) -> str:
    """``"gpu-events"`` with an event factory, ``"host-wait"`` without."""
    return GPU_BASIS if events is not None else HOST_BASIS
