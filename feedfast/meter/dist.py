"""Per-rank figures under torch.distributed, their aggregate over ranks, and the straggler."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from feedfast.errors import FeedfastError
from feedfast.meter.stats import MIN_STEPS, verdict

_PER_RANK_KEYS = (
    "steps",
    "samples",
    "unsized_steps",
    "wall_s",
    "wait_s",
    "stall_fraction",
    "host_stall_fraction",
    "wait_p50_ms",
    "wait_p95_ms",
    "wait_max_ms",
    "step_p50_ms",
    "samples_per_s",
    "required_samples_per_s",
    "verdict",
    "basis",
    "cpu_util",
    "gpu_util",
)


def _process_group() -> tuple[Any, int, int] | None:
    """``(torch.distributed, rank, world_size)`` when a process group is up, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist, dist.get_rank(), dist.get_world_size()


def straggler(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The rank that waited longest for data (most ``wait_s``; lowest rank on a tie).

    Args:
        ranks: Per-rank figures, each with ``rank``, ``wait_s`` and ``stall_fraction``.
    """
    worst = max(ranks, key=lambda r: (r.get("wait_s") or 0.0, -r["rank"]))
    return {key: worst.get(key) for key in ("rank", "wait_s", "stall_fraction", "verdict")}


AGGREGATE = (
    "over ranks: stall fractions, wall and waits are the worst rank's (under DDP every rank waits for the slowest "
    "at each step, so one starved rank stalls them all: the job loses at least the worst rank's stall), samples and "
    "rates are summed (the job's), steps are the fewest; the verdict is on the worst stall"
)
"""How :func:`aggregate` combines the ranks' figures, and why (``summary()["aggregate"]``)."""

_WORST = ("wall_s", "wait_s", "stall_fraction", "host_stall_fraction", "wait_p50_ms", "wait_p95_ms", "wait_max_ms",
          "step_p50_ms")
_SUMMED = ("samples", "unsized_steps", "samples_per_s", "required_samples_per_s")


def _over(ranks: Sequence[dict[str, Any]], key: str, combine: Callable[[list[Any]], Any]) -> Any:
    values = [r.get(key) for r in ranks if r.get(key) is not None]
    return combine(values) if values else None


def aggregate(ranks: Sequence[dict[str, Any]], min_steps: int = MIN_STEPS) -> dict[str, Any]:
    """The job's figures from every rank's (see :data:`AGGREGATE`).

    Args:
        ranks: Per-rank figures (``_PER_RANK_KEYS``); a missing figure is left out.
        min_steps: Steps the verdict needs.

    Returns:
        The run figures' keys over all ranks, ``stall_fraction_mean`` (the mean of the
        ranks' stall fractions, for comparison) and ``aggregate`` (how they combine).
    """
    out: dict[str, Any] = {key: _over(ranks, key, max) for key in _WORST}
    out.update({key: _over(ranks, key, sum) for key in _SUMMED})
    out["steps"] = _over(ranks, "steps", min)
    out["stall_fraction_mean"] = _over(ranks, "stall_fraction", lambda v: sum(v) / len(v))
    out["verdict"] = verdict(out["stall_fraction"], out["steps"] or 0, min_steps)
    out["aggregate"] = AGGREGATE
    return out


def gather_figures(local: dict[str, Any]) -> dict[str, Any]:
    """Gather every rank's figures; a collective, so every rank must call it.

    Without an initialized process group this is the one process, as rank 0. With
    NCCL, ``torch.cuda.set_device`` must have been called (``all_gather_object`` uses
    the current device).

    Args:
        local: This rank's summary.

    Returns:
        ``world_size``, ``ranks`` (one dict per rank, in rank order, with the main
        figures), ``straggler`` and ``job`` (:func:`aggregate` of the ranks, needing
        ``local["min_steps"]`` steps for a verdict).

    Raises:
        FeedfastError: The gather failed (a rank died, backends disagree).
    """
    mine = {key: local.get(key) for key in _PER_RANK_KEYS}
    group = _process_group()
    if group is None:
        ranks = [{"rank": 0, **mine}]
    else:
        dist, rank, world = group
        gathered: list[Any] = [None] * world
        try:
            dist.all_gather_object(gathered, {"rank": rank, **mine})
        except RuntimeError as exc:
            raise FeedfastError(f"StallMeter.gather() failed on rank {rank}: {exc}") from exc
        ranks = list(gathered)
    job = aggregate(ranks, local.get("min_steps") or MIN_STEPS)
    return {"world_size": len(ranks), "ranks": ranks, "straggler": straggler(ranks), "job": job}
