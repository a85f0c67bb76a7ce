"""How many samples a batch holds, for any batch shape a loader yields."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from feedfast.errors import UserError

BatchSize = int | Callable[[Any], int] | None
"""A fixed sample count, a function of the batch, or None to infer it."""

_MAX_DEPTH = 8


def infer_batch_size(batch: Any) -> int | None:
    """The first dimension of the first tensor found in a batch.

    Anything with a non-empty ``shape`` counts as a tensor (torch, numpy, DALI
    outputs converted to torch). Tuples and lists are searched in order, mappings in
    insertion order, depth first.

    ====================================  ======
    batch                                 result
    ====================================  ======
    ``tensor[32, 3, 224, 224]``           32
    ``(tensor[32, 3, H, W], tensor[32])``  32
    ``{"image": tensor[8, ...]}``         8
    ``[{"jpg": tensor[4, ...]}]`` (DALI)  4
    ``tensor[]`` (a scalar), ``"text"``   None
    ``[1, 2, 3]`` (no tensor)             None
    ====================================  ======

    Args:
        batch: What the loader yielded.

    Returns:
        The sample count, or None when no tensor with a first dimension is found.
    """
    return _search(batch, 0)


def _search(value: Any, depth: int) -> int | None:
    shape = getattr(value, "shape", None)
    if shape is not None and not callable(shape):
        try:
            return int(shape[0]) if len(shape) > 0 else None
        except (TypeError, IndexError, ValueError):
            return None
    if depth >= _MAX_DEPTH or isinstance(value, (str, bytes)):
        return None
    if isinstance(value, Mapping):
        children: Any = value.values()
    elif isinstance(value, (tuple, list)):
        children = value
    else:
        return None
    for child in children:
        found = _search(child, depth + 1)
        if found is not None:
            return found
    return None


def check_batch_size(batch_size: BatchSize) -> BatchSize:
    """Validate the ``batch_size=`` setting of a meter.

    Raises:
        UserError: Not None, a positive int, or a callable.
    """
    if batch_size is None or callable(batch_size):
        return batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(
            f"StallMeter: batch_size got {batch_size!r}; allowed: None (infer from the "
            "batch), a positive int, or a callable batch -> int"
        )
    return batch_size


def count_samples(batch: Any, batch_size: BatchSize) -> int | None:
    """Samples in ``batch``: the override when given, else inferred.

    Raises:
        UserError: A ``batch_size`` callable returned something other than an int >= 0.
    """
    if batch_size is None:
        return infer_batch_size(batch)
    if isinstance(batch_size, int):
        return batch_size
    n = batch_size(batch)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UserError(
            f"StallMeter: the batch_size callable returned {n!r}; it must return an int >= 0"
        )
    return n


def unsized_message(batch: Any) -> str:
    """The warning for a batch whose size cannot be told (given once per meter)."""
    return (
        f"StallMeter: cannot tell the batch size of a {type(batch).__name__}; such steps "
        "count in time but not in samples (summary 'unsized_steps'); fix: "
        "StallMeter(batch_size=N or a callable)"
    )
