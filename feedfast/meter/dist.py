"""Per-rank figures under torch.distributed, and the straggler."""

from __future__ import annotations

from typing import Any

from feedfast.errors import FeedfastError

_PER_RANK_KEYS = (
    "steps",
    "samples",
    "wall_s",
    "wait_s",
    "stall_fraction",
    "wait_p50_ms",
    "wait_p95_ms",
    "wait_max_ms",
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


def gather_figures(local: dict[str, Any]) -> dict[str, Any]:
    """Gather every rank's figures; a collective, so every rank must call it.

    Without an initialized process group this is the one process, as rank 0. With
    NCCL, ``torch.cuda.set_device`` must have been called (``all_gather_object`` uses
    the current device).

    Args:
        local: This rank's summary.

    Returns:
        ``world_size``, ``ranks`` (one dict per rank, in rank order, with the main
        figures) and ``straggler``.

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
    return {"world_size": len(ranks), "ranks": ranks, "straggler": straggler(ranks)}
