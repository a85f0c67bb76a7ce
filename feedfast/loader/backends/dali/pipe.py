"""Building DALI pipelines: one for the loader's life behind feedfast's feed (:mod:`.life`), or, behind DALI's
own reader (an unshuffled epoch of local shards), one per epoch, driven for exactly its steps and released."""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any

from feedfast.compile.dali import ReaderConfig, build_pipeline
from feedfast.compile.plan import Plan
from feedfast.errors import BackendError
from feedfast.loader.backends.dali.diagnose import first_line
from feedfast.loader.backends.dali.life import StepQueue
from feedfast.order.deal import EpochPlan
from feedfast.sources.dataset import ShardSet

CHECKPOINT_EVERY = 16
"""Batches between two of DALI's checkpoints when no batch carries its own state (``sample_info`` off).

``Pipeline.checkpoint()`` serializes every stateful operator's state (on a GPU, its random
generators' states read back from the device); a state taken between two checkpoints resumes
from the last one and makes at most this many batches again (see :mod:`feedfast.loader.state`).
"""


def make_pipeline(plan: Plan, shards: ShardSet, ep: EpochPlan, *, rank: int, world: int, batch_size: int,
                  threads: int, device_id: int | None, seed: int, epoch: int, prefetch: int,
                  checkpoint: str | None, start: int = 0) -> EpochPipe:
    """Build the epoch's DALI pipeline behind DALI's reader: shards in the epoch's order, this rank's range."""
    reader = ReaderConfig(
        paths=[shards.paths[i] for i in ep.shard_order],
        index_paths=[shards.index_paths[i] for i in ep.shard_order],
        shard_id=rank, num_shards=world, shuffle_buffer=plan.spec.shuffle_buffer,
        missing=plan.spec.missing, stick_to_shard=True, seed=epoch_seed(seed, epoch, rank),
    )
    remaining = ep.steps - start
    depth = max(1, min(prefetch, remaining))
    pipe, omap = _built(plan, reader, batch_size=batch_size, threads=threads, device_id=device_id,
                        seed=epoch_seed(seed, epoch, rank), depth=depth, checkpoint=checkpoint)
    return EpochPipe(pipe, omap, epoch, start, remaining, depth)


def make_life(plan: Plan, queue: StepQueue, *, batch_size: int, threads: int, device_id: int | None, seed: int,
              depth: int, checkpoint: str | None) -> tuple[Any, Any]:
    """Build the pipeline fed by ``queue`` for the loader's life (:mod:`.life`), restored from ``checkpoint`` (DALI's
    own, unwrapped) when given; ``seed``: the pipeline's (:func:`epoch_seed` of the epoch it starts at)."""
    reader = ReaderConfig(paths=[], index_paths=[], feed=queue)
    return _built(plan, reader, batch_size=batch_size, threads=threads, device_id=device_id, seed=seed,
                  depth=depth, checkpoint=checkpoint)


def _built(plan: Plan, reader: ReaderConfig, *, batch_size: int, threads: int, device_id: int | None, seed: int,
           depth: int, checkpoint: str | None) -> tuple[Any, Any]:
    """The plan's pipeline, built (``Pipeline.build``)."""
    if plan.placement == "gpu" and device_id is None:  # DALI would limit the pipeline to CPU operators
        raise BackendError("a GPU-placed plan needs DALI's device_id (the delivery rule gave none): "
                           "this is a feedfast bug; please report it")
    pipe, omap = build_pipeline(plan, reader, batch_size=batch_size, num_threads=threads, device_id=device_id,
                                seed=seed, prefetch_queue_depth=depth, checkpoint=checkpoint)
    try:
        pipe.build()
    except RuntimeError as exc:
        raise BackendError(f"DALI could not build the pipeline for {plan.spec.file}: {first_line(exc)}") from exc
    return pipe, omap


def release_memory(pipe: Any = None, *, pools: bool = True) -> None:
    """Destroy a pipeline now and give back what it held: DALI's pools (when ``pools``) and free heap pages.

    A pipeline is built per epoch. DALI's Python ``Pipeline`` sits in reference cycles, so
    it would be freed only by the cyclic GC (a full collection costs 0.2 to 0.4 s here);
    shutting its backend down directly (``Pipeline._shutdown``, what its ``__del__`` calls)
    frees the C++ side at once. Without the release, pooled and fragmented heap memory
    grows resident size by a few hundred MB over the first epochs before levelling off.

    On a GPU (``pools=False``) DALI's memory pools are kept: the next epoch's pipeline reuses
    the device and pinned pools nvJPEG grew, instead of allocating them again while the GPU
    waits; the loader's ``close()`` releases them.
    """
    shutdown = getattr(pipe, "_shutdown", None)
    if callable(shutdown):
        shutdown()
    elif pipe is not None:
        import gc

        gc.collect()
    if not pools:
        return
    try:
        from nvidia.dali import backend

        backend.ReleaseUnusedMemory()
    except (ImportError, AttributeError, RuntimeError) as exc:
        warnings.warn(f"could not release DALI's unused memory: {exc}", stacklevel=2)
    _malloc_trim()


def _malloc_trim() -> None:
    """glibc's ``malloc_trim(0)``: return free heap pages to the OS (Linux/glibc only)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):
        return  # not glibc (musl has no malloc_trim): nothing to trim


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of a pipeline that starts at ``epoch`` (DALI's random operators draw from it)."""
    return (seed * 1_000_003 + epoch * 7919 + rank * 104_729) % (2**31 - 1)


@dataclass
class EpochPipe:
    """A DALI pipeline bound to one epoch and driven for exactly its remaining steps.

    ``Pipeline.run()`` schedules one iteration past every batch it returns, so a pipeline
    per epoch would decode ``prefetch`` batches nobody reads. Scheduling by hand stops at
    the epoch's last step; :meth:`prefetch` starts the work early (the loader calls it on
    the next epoch's pipeline while the current one drains).
    """

    pipe: Any
    omap: Any
    epoch: int
    start: int
    remaining: int
    depth: int
    scheduled: int = 0

    def prefetch(self) -> None:
        """Start computing the first batches, without waiting for them."""
        if self.scheduled == 0 and self.remaining > 0:
            self.pipe.schedule_run()  # DALI's first call queues ``depth`` iterations
            self.scheduled = self.depth

    def next(self) -> Any:
        """The next batch's outputs, keeping ``depth`` iterations in flight within the epoch."""
        if self.scheduled == 0:
            self.prefetch()
        elif self.scheduled < self.remaining:
            self.pipe.schedule_run()
            self.scheduled += 1
        return self.pipe.outputs()

    def checkpoint(self) -> str:
        """DALI's checkpoint after the last batch (as text, the form a resumed state gives back)."""
        state = self.pipe.checkpoint()
        return state.decode("latin-1") if isinstance(state, bytes) else str(state)

    @property
    def all_scheduled(self) -> bool:
        """Whether every step of the epoch has been handed to DALI."""
        return self.scheduled >= self.remaining
