"""The one place feedfast reads its environment (variables, CUDA presence, cache folder), and the rank's CUDA
device that follows from it: one rule for the loader and the stall meter, below both."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from feedfast.errors import UserError

if TYPE_CHECKING:
    import torch


def cache_dir() -> Path:
    """feedfast's cache folder: ``$FEEDFAST_CACHE``, else ``$XDG_CACHE_HOME/feedfast``, else ``~/.cache/feedfast``.

    The folder need not exist yet (it is made when something is cached).

    Raises:
        UserError: the variable that chose it names a plain file, or a path under one.
    """
    if os.environ.get("FEEDFAST_CACHE"):
        return _folder_path(Path(os.environ["FEEDFAST_CACHE"]), "FEEDFAST_CACHE")
    if os.environ.get("XDG_CACHE_HOME"):
        return _folder_path(Path(os.environ["XDG_CACHE_HOME"]) / "feedfast", "XDG_CACHE_HOME")
    return Path(os.path.expanduser("~"), ".cache", "feedfast")


def _folder_path(path: Path, variable: str) -> Path:
    """``path`` when it is a folder or can become one; a UserError naming ``variable`` when a file is in the way."""
    for part in (path, *path.parents):
        if part.exists():
            if part.is_dir():
                return path
            where = "is a file" if part == path else f"is under {str(part)!r}, a file"
            raise UserError(f"environment variable {variable}={os.environ[variable]!r} {where}, not a folder: "
                            f"feedfast keeps its cache (indexes, downloaded shards) there; set {variable} to a "
                            "folder (it is made if missing) or unset it")
    return path


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


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine, None where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def launcher_int(name: str) -> int | None:
    """A launcher variable (``RANK``, ...) as an integer; None when unset or empty.

    Raises:
        UserError: the variable is set but is not a plain decimal integer (``abc``, ``1.0``): a
            rank read as 0 would let two processes read the same samples.
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    if not _INTEGER.fullmatch(text):
        raise UserError(f"environment variable {name}={os.environ[name]!r} is not an integer; the launcher "
                        f"(torchrun, srun, ...) sets {', '.join(LAUNCHER_VARIABLES)} to whole numbers: unset it "
                        "or set it to one")
    return int(text)


def launcher_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun's); 0, 1, 0 when unset.

    Every launcher variable is checked, ``LOCAL_WORLD_SIZE`` too (a launcher sets them together).

    Raises:
        UserError: one is set but not an integer (see :func:`launcher_int`).
    """
    found = {name: launcher_int(name) for name in LAUNCHER_VARIABLES}
    rank, world, local = found["RANK"], found["WORLD_SIZE"], found["LOCAL_RANK"]
    return (0 if rank is None else rank), (1 if world is None else world), (0 if local is None else local)


def launcher_local_rank() -> int | None:
    """``LOCAL_RANK`` as set by torchrun (or another launcher), None when unset.

    Raises:
        UserError: it is set but not an integer.
    """
    return launcher_int("LOCAL_RANK")


def rank_cuda_index(*, local_rank: int | None, count: int, current: int) -> int:
    """The CUDA index ``cuda`` means for this process: ``LOCAL_RANK`` when set and valid, else the current device."""
    if local_rank is not None and 0 <= local_rank < count:
        return local_rank
    return current


def rank_cuda_device() -> torch.device | None:
    """The rank's CUDA device in this process (``cuda:{LOCAL_RANK}`` under a launcher, else the current
    device), or None without CUDA: what ``device='cuda'`` means to the loader and to the stall meter.

    It never initializes CUDA: before torch has, the current device is 0.
    """
    if not cuda_available():
        return None
    import torch

    current = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    index = rank_cuda_index(local_rank=launcher_local_rank(), count=torch.cuda.device_count(), current=current)
    return torch.device("cuda", index)
