"""The DataLoader's torch-style arguments, checked once at the edge and kept as one typed object.

:func:`loader_settings` takes what ``DataLoader(...)`` was given (after the spec) and gives a
frozen :class:`LoaderSettings`, or raises a :class:`~feedfast.errors.UserError` naming the
argument, the value and what is allowed (the checks themselves live in :mod:`.options`). What
depends on the machine or the data (the device rule, the plan, the shards, the backend) is
decided after, by the loader's stages, from these settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from feedfast import _env
from feedfast.checks.validate import DEFAULT_MAX_PIXELS
from feedfast.errors import UserError
from feedfast.loader.batchhook import BatchHook, check_batch_hook
from feedfast.loader.knobs import Knobs
from feedfast.loader.options import (
    at_least_zero,
    positive,
    rank_cores,
    seconds_above_zero,
    threads_for,
    timeout_seconds,
)
from feedfast.shards.transport.remote import Transfer
from feedfast.spec.model import Spec


@dataclass(frozen=True)
class LoaderSettings:
    """Every DataLoader argument after its check (see :class:`~feedfast.DataLoader` for their meaning).

    Attributes:
        threads: CPU threads of the ``dali`` and ``threads`` backends (``num_workers``, 0 meaning 1).
        workers: the ``pil`` backend's worker processes (``num_workers`` as given; default ``threads``).
        prefetch: batches made ahead (``prefetch_factor``, else the spec's, else 2).
        tune: whether the tuner searches threads and batches ahead.
        knobs: the live threads and batches ahead, bounded for a tuner.
        rank, world: this rank and the world size.
        backend, placement: as requested (``auto`` and the spec's resolved later).
        device: the delivery device asked for (None: the rule's default).
        wait_s: seconds ``next()`` waits for a batch (torch's ``timeout``; None: forever).
        open_kw: how the dataset is opened (pixel limit, remote cache limit, retries).
    """

    spec: Spec
    threads: int
    workers: int
    prefetch: int
    tune: bool
    knobs: Knobs
    rank: int
    world: int
    backend: str
    placement: str | None
    device: str | torch.device | None
    pin_memory: bool
    pin_memory_device: str | None
    cache_dir: Path
    max_pixels: int
    open_kw: dict[str, Any]
    sample_info: bool
    hook: BatchHook | None
    wait_s: float | None


def dist_rank() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialized, else the launcher's environment."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    rank, world, _ = _env.launcher_rank()
    return rank, world


def loader_settings(spec: Spec, *, num_workers: int | None, pin_memory: bool, prefetch_factor: int | None,
                    device: str | torch.device | None, placement: str | None, rank: int | None,
                    world_size: int | None, cache_dir: str | os.PathLike[str] | None, pin_memory_device: str | None,
                    on_error: str | None, max_pixels: int | None, backend: str | None, cache_limit: int | None,
                    remote_retries: int | None, remote_timeout: float | None, sample_info: bool, tune: bool | None,
                    collate_fn: Any, timeout: Any) -> LoaderSettings:
    """The arguments checked (UserError naming the first that is wrong) and settled against the spec's defaults."""
    run = spec.loader
    given_workers = run.threads if num_workers is None else num_workers
    threads = threads_for(given_workers)
    prefetch = positive("prefetch_factor", prefetch_factor if prefetch_factor is not None else run.prefetch or 2)
    tuned = spec.tune.enabled if tune is None else bool(tune)
    # a tuned loader may go up to one thread per core of its rank's share plus one, and twice the batches ahead
    knobs = Knobs(threads, prefetch, max_threads=rank_cores() + 1 if tuned else 0,
                  max_prefetch=2 * prefetch if tuned else 0)
    found_rank, found_world = dist_rank() if rank is None or world_size is None else (rank, world_size)
    rank, world = (found_rank if rank is None else rank), (found_world if world_size is None else world_size)
    if not 0 <= rank < world:
        raise UserError(f"rank must be in [0, world_size), got rank={rank}, world_size={world}")
    if on_error is not None and on_error not in ("raise", "skip"):
        raise UserError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    limit = positive("max_pixels", max_pixels) if max_pixels is not None else DEFAULT_MAX_PIXELS
    open_kw: dict[str, Any] = dict(
        max_pixels=limit,
        cache_limit=positive("cache_limit", cache_limit) if cache_limit is not None else None,
        transfer=remote_transfer(remote_retries, remote_timeout),
    )
    return LoaderSettings(
        spec=spec.replace(on_error=on_error) if on_error else spec, threads=threads,
        workers=threads if given_workers is None else given_workers,  # pil: 0 runs in this process, as in torch
        prefetch=prefetch, tune=tuned, knobs=knobs, rank=rank, world=world,
        backend=backend or run.backend or "auto", placement=placement, device=device, pin_memory=bool(pin_memory),
        pin_memory_device=pin_memory_device, cache_dir=Path(cache_dir) if cache_dir else _env.cache_dir(),
        max_pixels=limit, open_kw=open_kw, sample_info=bool(sample_info), hook=check_batch_hook(collate_fn),
        wait_s=timeout_seconds(timeout),
    )


def remote_transfer(retries: int | None, timeout: float | None) -> Transfer:
    """The remote reads' :class:`~feedfast.shards.transport.remote.Transfer` for ``remote_retries`` and ``remote_timeout``.

    ``remote_timeout`` is a fetch's deadline, its retries included (its bytes at ``min_rate`` come on top); a
    socket read waits at most 30 s or the deadline, the shorter.
    """
    base = Transfer()
    deadline = base.deadline if timeout is None else seconds_above_zero("remote_timeout", timeout)
    return Transfer(retries=base.retries if retries is None else at_least_zero("remote_retries", retries),
                    deadline=deadline, timeout=min(base.timeout, deadline))
