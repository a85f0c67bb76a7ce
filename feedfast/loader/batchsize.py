"""Whether a batch size can be allocated: checked when the loader is built, before any buffer is.

Every backend sizes buffers by the batch size (DALI's pipeline by ``max_batch_size``, a C int;
the threaded path and the pinned ring by the batch's shape), so an absurd size fails deep
inside with a raw ``MemoryError`` or a ``TypeError``. :func:`check_batch_size` refuses it first,
naming the sizes: a batch size above :data:`MAX_BATCH_SIZE`, or one whose one batch would take
more than the machine's memory, counted from the outputs' declared shapes and types (an extent
that varies counts as one). The bound is loose on purpose: a loader holds a few batches (made
ahead, being made, a spare), and a batch on the GPU lives in the GPU's memory, so a batch size
that passes can still be too large; one that fails could never run.
"""

from __future__ import annotations

import math

import numpy as np

from feedfast.compile.plan import Plan
from feedfast.errors import UserError

MAX_BATCH_SIZE = 2**31 - 1  # DALI's max_batch_size is a C int


def sample_bytes(plan: Plan) -> int:
    """Bytes one sample's outputs take, from their declared signatures (host objects count 8)."""
    total = 0
    for nid in plan.outputs.values():
        sig = plan.nodes[nid].sig
        size = 8 if sig.dtype in ("object", "any") else np.dtype(sig.dtype).itemsize
        total += size * math.prod(d or 1 for d in sig.shape)
    return max(total, 1)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return ""  # unreachable


def check_batch_size(batch_size: int, *, samples: int, world: int, per_sample: int, memory: int | None) -> None:
    """Refuse a batch size that cannot be allocated (see the module docstring).

    Args:
        batch_size: the batch size asked for.
        samples, world: the dataset's samples and the ranks sharing them (for the message's advice).
        per_sample: :func:`sample_bytes` of the plan.
        memory: the machine's memory in bytes (None: unknown, only the fixed bound applies).

    Raises:
        UserError: names the batch size, the batch's bytes, the memory and the samples a rank has.
    """
    need = batch_size * per_sample
    if batch_size <= MAX_BATCH_SIZE and (memory is None or need <= memory):
        return
    per_rank = -(-samples // world)
    what = (f"one batch is {_size(need)} ({_size(per_sample)} a sample)"
            + (f", more than this machine's {_size(memory)}" if memory is not None and need > memory else ""))
    limit = "" if batch_size <= MAX_BATCH_SIZE else f"; the largest batch size DALI takes is {MAX_BATCH_SIZE:,}"
    raise UserError(f"batch size {batch_size:,} cannot be allocated: {what}{limit}; the dataset has {samples:,} samples "
                    f"({per_rank:,} a rank over {world}): use a batch size of at most {per_rank:,} "
                    "(a larger one only makes every batch partial)")
