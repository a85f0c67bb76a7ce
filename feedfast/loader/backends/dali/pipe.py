"""Building the DALI pipeline behind feedfast's feed, one for the loader's life (:mod:`.life`), and giving its memory
back."""

from __future__ import annotations

import sys
import warnings
from typing import Any

from feedfast.compile.dali import ReaderConfig, build_pipeline
from feedfast.compile.plan import Plan
from feedfast.errors import BackendError
from feedfast.loader.backends.dali.diagnose import first_line
from feedfast.loader.backends.dali.life import StepQueue

CHECKPOINT_EVERY = 16
"""Batches between two of DALI's checkpoints when no batch carries its own state (``sample_info`` off).

``Pipeline.checkpoint()`` serializes every stateful operator's state (on a GPU, its random
generators' states read back from the device); a state taken between two checkpoints resumes
from the last one and makes at most this many batches again (see :mod:`feedfast.loader.state`).
"""


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
