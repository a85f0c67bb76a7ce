"""The one place feedfast reads its environment (variables, CUDA presence, cache folder)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path


def cache_dir() -> Path:
    """feedfast's cache folder: ``$FEEDFAST_CACHE``, else ``$XDG_CACHE_HOME/feedfast``, else ``~/.cache/feedfast``."""
    if os.environ.get("FEEDFAST_CACHE"):
        return Path(os.environ["FEEDFAST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "feedfast"


@lru_cache(maxsize=1)
def cuda_available() -> bool:
    """Whether torch sees a usable CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, so containers and taskset count), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def launcher_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun's)."""
    def _int(name: str, default: int) -> int:
        v = os.environ.get(name, "")
        return int(v) if v.strip().lstrip("-").isdigit() else default

    return _int("RANK", 0), _int("WORLD_SIZE", 1), _int("LOCAL_RANK", 0)


def launcher_local_rank() -> int | None:
    """``LOCAL_RANK`` as set by torchrun (or another launcher), None when unset or not an integer."""
    v = os.environ.get("LOCAL_RANK", "").strip()
    return int(v) if v.isdigit() else None
