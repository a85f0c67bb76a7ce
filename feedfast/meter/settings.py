"""Checks of StallMeter's settings, done once at the edge; messages name the field."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from feedfast.errors import UserError
from feedfast.meter.nvml import NvmlSampler
from feedfast.meter.samplers import CpuSampler, Sampler


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` when it is an int >= ``minimum``.

    Raises:
        UserError: It is not; the message names ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"StallMeter: {name} got {value!r}; allowed: an int >= {minimum}")
    return value


def check_rate(name: str, value: Any) -> float:
    """``value`` as a float when it is a number in (0, 1000].

    Raises:
        UserError: It is not.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1000:
        raise UserError(f"StallMeter: {name} got {value!r}; allowed: a number in (0, 1000]")
    return float(value)


def check_callback(every: int, callback: Callable[..., Any] | None) -> None:
    """``every`` and ``callback`` come together or not at all.

    Raises:
        UserError: One without the other, or a callback that is not callable.
    """
    if (every > 0) != (callback is not None) or (callback is not None and not callable(callback)):
        raise UserError(
            f"StallMeter: every={every!r} and callback={callback!r} go together; "
            "fix: pass both every=N (N >= 1) and a callable callback, or neither"
        )


def build_samplers(setting: bool | Sequence[Sampler], hz: float, cuda_index: int | None = None) -> list[Sampler]:
    """The samplers a ``samplers=`` setting asks for (True: CPU and NVML, the latter on CUDA device
    ``cuda_index``: the meter's own device, default 0).

    Raises:
        UserError: The setting holds something that is not a Sampler.
    """
    if setting is True:
        return [CpuSampler(hz=hz), NvmlSampler(cuda_index=cuda_index, hz=hz)]
    if setting is False:
        return []
    samplers = list(setting)
    for sampler in samplers:
        if not isinstance(sampler, Sampler):
            raise UserError(
                f"StallMeter: samplers holds a {type(sampler).__name__}, not a Sampler; "
                "allowed: True, False, or a list of Sampler objects"
            )
    return samplers
