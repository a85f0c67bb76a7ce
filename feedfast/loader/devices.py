"""Where the pipeline runs and where batches go: one rule, and the device layer the loader uses.

The rule (:func:`resolve_route`), for ``placement`` (``auto``, ``cpu``, ``gpu``; the spec's
``device`` when the loader gets none) and the loader's ``device`` (unset, ``cpu``, ``cuda``,
``cuda:N``):

=============  ==============  =====================  ===============================================
placement      device          pipeline runs on       batches are delivered to
=============  ==============  =====================  ===============================================
auto           unset           GPU if CUDA, else CPU  the rank's CUDA device if CUDA, else the CPU
auto           ``cpu``         CPU                    CPU (no GPU decode only to copy back)
auto           ``cuda[:N]``    GPU                    that CUDA device
cpu            unset / cpu     CPU                    CPU
cpu            ``cuda[:N]``    CPU                    that CUDA device, through the pinned ring
                                                      (uint8 copy, normalized on the device)
gpu            unset           GPU                    the rank's CUDA device
gpu            ``cuda[:N]``    GPU                    that CUDA device
gpu            ``cpu``         GPU                    CPU: a device-to-host copy per batch, with a
                                                      warning (you asked for both)
=============  ==============  =====================  ===============================================

``gpu`` or ``cuda`` without a usable CUDA device is a :class:`~feedfast.errors.UserError`.
"The rank's CUDA device" is ``cuda:{LOCAL_RANK}`` under a launcher that sets ``LOCAL_RANK``
(torchrun) and has that many devices, else ``torch.cuda.current_device()``; ``cuda`` without
an index means the same. One index serves DALI's ``device_id``, the output tensors, the side
stream and its events.

The device layer (:class:`CudaLayer`, :class:`HostLayer`) is the only code that touches
``torch.cuda`` streams and events. Tests swap in a stand-in layer that records what was
ordered after what, so the prefetch ordering is checked without a GPU. A thread that
touches CUDA for the loader (its producer thread) calls :meth:`DeviceLayer.bind_thread`
before anything else, as torch's pin-memory thread does: a new thread's current device is
0, and ``torch.cuda.stream`` saves and restores the *current* device's stream, so an
unbound producer of rank 1 would open a CUDA context on GPU 0.

The stall meter finds its device with the same rule (:func:`feedfast._env.rank_cuda_device`), so its
events are recorded on the stream the loader delivers to.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, ContextManager, Protocol

import torch

from feedfast import _env
from feedfast._env import rank_cuda_index
from feedfast.errors import UserError


@dataclass(frozen=True)
class Route:
    """The resolved rule: ``placement`` of the pipeline, ``device`` of the batches, DALI's ``device_id``."""

    placement: str
    device: torch.device
    device_id: int | None


def resolve_route(placement: str, device: str | torch.device | None, *, cuda: bool, count: int = 0,
                     current: int = 0, local_rank: int | None = None) -> Route:
    """Apply the rule in this module's docstring (a pure function of its arguments).

    Args:
        placement: ``auto``, ``cpu`` or ``gpu``.
        device: the loader's ``device`` argument, or None when unset.
        cuda: whether a CUDA device is usable.
        count, current, local_rank: CUDA device count, ``torch.cuda.current_device()``, and
            ``LOCAL_RANK`` (None when the launcher did not set it).
    """
    if placement not in ("auto", "cpu", "gpu"):
        raise UserError(f"placement must be 'auto', 'cpu' or 'gpu', got {placement!r}")
    wanted = _parse_device(device)
    if wanted is not None and wanted.type == "cuda" or placement == "gpu":
        if not cuda:
            what = f"device={str(device)!r}" if wanted is not None and wanted.type == "cuda" else "placement='gpu'"
            raise UserError(f"{what} needs a usable CUDA device and torch sees none: use device='cpu' and "
                            f"placement='cpu' (or 'auto'), or install a CUDA build of torch")
    if wanted is not None and wanted.type == "cuda" and wanted.index is not None and not 0 <= wanted.index < count:
        raise UserError(f"device={str(device)!r} does not exist: torch sees {count} CUDA device(s)")
    index = rank_cuda_index(local_rank=local_rank, count=count, current=current)
    if wanted is None:
        runs = "gpu" if placement == "gpu" or (placement == "auto" and cuda) else "cpu"
        target = torch.device("cuda", index) if runs == "gpu" else torch.device("cpu")
    elif wanted.type == "cpu":
        runs = "gpu" if placement == "gpu" else "cpu"
        target = wanted
    else:
        runs = "cpu" if placement == "cpu" else "gpu"
        target = torch.device("cuda", index if wanted.index is None else wanted.index)
    device_id = (target.index if target.type == "cuda" else index) if runs == "gpu" else None
    return Route(runs, target, device_id)


def _parse_device(device: str | torch.device | None) -> torch.device | None:
    if device is None:
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UserError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc
    if parsed.type not in ("cpu", "cuda"):
        raise UserError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return parsed


def route_here(placement: str, device: str | torch.device | None) -> Route:
    """:func:`resolve_route` for this process: torch's CUDA state and the launcher's ``LOCAL_RANK``."""
    cuda = _env.cuda_available()
    count = torch.cuda.device_count() if cuda else 0
    current = torch.cuda.current_device() if cuda else 0
    local = _env.launcher_local_rank()
    found = resolve_route(placement, device, cuda=cuda, count=count, current=current, local_rank=local)
    if found.placement == "gpu" and found.device.type == "cpu":
        warnings.warn("placement='gpu' with device='cpu': batches are decoded on the GPU and copied back to "
                      "host memory every step; use placement='cpu' for CPU tensors without the round trip",
                      stacklevel=3)
    return found


class DeviceLayer(Protocol):
    """Streams, events and copies for one device; ``torch.cuda`` or a stand-in."""

    device: torch.device
    cuda: bool

    def bind_thread(self) -> None:
        """Make this layer's device the calling thread's current device (first thing on a new thread)."""

    def new_stream(self) -> Any: ...  # noqa: D102

    def current_stream(self) -> Any: ...  # noqa: D102

    def new_event(self) -> Any: ...  # noqa: D102

    def on(self, stream: Any) -> ContextManager[Any]: ...  # noqa: D102

    def host_buffer(self, numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor: ...  # noqa: D102

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor: ...  # noqa: D102

    def copy_in(self, host: torch.Tensor) -> torch.Tensor: ...  # noqa: D102

    def keep_for(self, tensor: torch.Tensor, stream: Any) -> None: ...  # noqa: D102


class NullStream:
    """A stand-in for ``torch.cuda.Stream`` on the CPU: ordering is program order."""

    def wait_stream(self, other: Any) -> None:  # noqa: D102 - mirrors torch's API
        return None

    def wait_event(self, event: Any) -> None:  # noqa: D102
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


class HostLayer:
    """The CPU: no streams, no copies; batches are handed over as they are."""

    cuda = False

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    def bind_thread(self) -> None:  # noqa: D102 - no device to bind
        return None

    def new_stream(self) -> NullStream:  # noqa: D102
        return NullStream()

    def current_stream(self) -> NullStream:  # noqa: D102
        return NullStream()

    def new_event(self) -> NullEvent:  # noqa: D102
        return NullEvent()

    def on(self, stream: Any) -> ContextManager[Any]:  # noqa: D102
        return contextlib.nullcontext()

    def host_buffer(self, numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:  # noqa: D102
        return torch.empty(numel, dtype=dtype)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:  # noqa: D102
        return torch.empty(shape, dtype=dtype)

    def copy_in(self, host: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return host

    def keep_for(self, tensor: torch.Tensor, stream: Any) -> None:  # noqa: D102
        return None


class CudaLayer:
    """One CUDA device through ``torch.cuda``; copies are asynchronous on the stream in use."""

    cuda = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def bind_thread(self) -> None:
        """``torch.cuda.set_device`` on the calling thread, before its first CUDA call."""
        torch.cuda.set_device(self.device)

    def new_stream(self) -> Any:  # noqa: D102
        return torch.cuda.Stream(self.device)

    def current_stream(self) -> Any:  # noqa: D102
        return torch.cuda.current_stream(self.device)

    def new_event(self) -> Any:  # noqa: D102
        return torch.cuda.Event()

    def on(self, stream: Any) -> ContextManager[Any]:  # noqa: D102
        return torch.cuda.stream(stream)

    def host_buffer(self, numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:  # noqa: D102
        return torch.empty(numel, dtype=dtype, pin_memory=pin)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:  # noqa: D102
        return torch.empty(shape, dtype=dtype, device=self.device)

    def copy_in(self, host: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return host.to(self.device, non_blocking=True)

    def keep_for(self, tensor: torch.Tensor, stream: Any) -> None:  # noqa: D102
        tensor.record_stream(stream)


def layer_for(device: torch.device) -> DeviceLayer:
    """The layer that serves ``device``."""
    return CudaLayer(device) if device.type == "cuda" else HostLayer()
