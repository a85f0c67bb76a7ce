"""What the backends that read samples themselves share: this rank's rows of an epoch, a row's members,
and how a sample's failure is named.

The rows are those DALI's reader would read: the shards concatenated in ``ep.shard_order``,
each shard's samples in the order of its (filtered) index; under the global order
(``ep.partition == "global"``, a shuffled epoch) the rank's share of the epoch's permutation,
else its contiguous range, permuted inside the range when the spec shuffles
(:func:`~feedfast.order.orders.epoch_rows`, the one place that decides it). A sample whose
processing raises (any exception class: a decoder's, a plugin's) is a
:class:`~feedfast.errors.SampleError` naming shard, key and reason (:func:`failure_reason`).
"""

from __future__ import annotations

import logging
import traceback

from feedfast.compile.pil import PilProgram, compile_pil
from feedfast.compile.plan import Plan
from feedfast.errors import BackendError
from feedfast.ops.generic import DecodeFailure
from feedfast.order.deal import EpochPlan
from feedfast.order.orders import epoch_rows
from feedfast.order.rows import Rows
from feedfast.sources.mixture import Dataset

log = logging.getLogger("feedfast.pil")


def epoch_samples(plan: Plan, shards: Dataset, ep: EpochPlan, *, rank: int, world: int, seed: int,
                  epoch: int, program: PilProgram | None = None) -> tuple[PilProgram, Rows]:
    """The plan's PIL program and this rank's rows of the epoch, checked against the epoch plan.

    Under ``ep.partition == "global"`` (a shuffled epoch), the rank's share of the epoch's global
    order; else its contiguous range, permuted inside the range when the spec shuffles
    (:func:`~feedfast.order.orders.epoch_rows`). ``program``: the backend's, compiled once (None: compiled here).
    """
    program = program or compile_pil(plan.spec)
    rows = epoch_rows(shards, program.exts, ep, rank=rank, world=world, seed=seed, epoch=epoch,
                      shuffle=plan.spec.shuffle_buffer > 0, block=shards.shuffle)
    if len(rows) != ep.rank_samples:
        raise BackendError(f"rank {rank} has {len(rows)} samples but its epoch plan expects {ep.rank_samples}")
    return program, rows


def failure_reason(exc: BaseException, shard: str, key: str) -> str:
    """Why a sample failed, in one line: a DecodeFailure's own reason, else the exception's class and first
    line (its traceback logged at DEBUG on ``feedfast.pil``, naming the sample)."""
    if isinstance(exc, DecodeFailure):
        return str(exc)
    log.debug("shard %r, sample %r:\n%s", shard, key, "".join(traceback.format_exception(exc)))
    text = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {text}"
