"""The Backend interface: everything the loader needs from what makes one rank's batches of an epoch.

=========  ==========================================================  ==========================
backend    what makes the batches                                      resumes from
=========  ==========================================================  ==========================
dali       one DALI pipeline for the loader's life (CPU or GPU         DALI's checkpoint
           placement), fed by feedfast's feed
threads    pillow-simd in threads, reduced-size JPEG decode, one       the step (per-sample RNG)
           crop-and-resize call per image (:mod:`.threads`)
pil        the PIL program in torch DataLoader worker processes        the step (per-sample RNG)
=========  ==========================================================  ==========================

``threads`` and ``pil`` give the same samples, crops and flips for a (seed, epoch, rank);
``dali`` gives the same samples per epoch and rank but its own order within its shuffle buffer
and its own augmentation draws. ``threads`` and ``pil`` read local shards with ``pread`` and
every other kind (http, s3, gs, the shard cache) by range, ahead of decoding
(:mod:`feedfast.sources.rangeread`). :func:`~.choose.choose_backend` picks one by what runs
the spec fastest, not by where its bytes live,
:func:`~.choose.make_backend` builds it from :class:`BackendSettings`.

A backend yields :class:`~feedfast.loader.batch.Batch` objects of host tensors, host values
or pending (DALI) outputs, on the loader's producer thread; it never moves a batch to the
consumer's device (:mod:`feedfast.loader.deliver` does) and never decides when the next epoch
starts (the producer asks :meth:`Backend.all_in_flight` and calls :meth:`Backend.prepare`).
What differs between backends is declared here, as class attributes, so that the loader asks
none of them for its name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator

from feedfast.compile.plan import Plan
from feedfast.errors import UserError
from feedfast.loader.batch import Batch
from feedfast.loader.knobs import Knobs
from feedfast.order.deal import EpochPlan
from feedfast.sources.mixture import Dataset


@dataclass(frozen=True)
class BackendSettings:
    """What every backend is built from: the loader's validated settings and its view of the data.

    Attributes:
        plan: the compiled plan (its placement decides DALI's CPU or GPU operators).
        shards_for: the dataset of an epoch (a :class:`~feedfast.Mix` draws one per epoch).
        plan_for: this rank's epoch plan of an epoch, from its start.
        rank, world, batch_size, seed: this rank, the world size, the spec's batch size and seed.
        threads: CPU threads (DALI's, the threaded path's at the start).
        workers: the ``pil`` backend's worker processes (0: batches made in the loader's process).
        prefetch: batches made ahead (DALI's queue depth).
        knobs: threads and batches ahead, read live (a tuner changes them).
        device_id: DALI's GPU, or None for a CPU pipeline.
        max_pixels: images with more pixels are bad.
        checkpoint_every: steps between two of DALI's checkpoints (1 when each batch carries its state).
    """

    plan: Plan
    shards_for: Callable[[int], Dataset]
    plan_for: Callable[[int], EpochPlan]
    rank: int
    world: int
    batch_size: int
    seed: int
    threads: int
    workers: int
    prefetch: int
    knobs: Knobs
    device_id: int | None
    max_pixels: int
    checkpoint_every: int


class Backend(ABC):
    """One backend: the batches of one rank's epoch from a step on, and what it holds between epochs.

    Class attributes say how it differs from the others:

    - ``name``: what ``DataLoader(backend=...)`` and a state call it;
    - ``checkpoints``: it resumes from its own checkpoint (``Batch.checkpoint``, validated on load by
      :meth:`check_checkpoint`); else from the step alone (its randomness is per sample);
    - ``tunable``: the knobs a tuner may change while it runs (:mod:`feedfast.loader.autotune`);
    - ``stop_at_exit``: its background work must be stopped before the interpreter joins its
      threads (the threaded path decodes in native code on pool threads);
    - ``pil_program``: it runs the spec as a PIL program (checked when the loader is built);
    - ``cpu_only``: it runs on the CPU whatever the spec's placement;
    - ``host_normalize``: it normalizes on the host, so the plan defers no ``normalize`` to the device;
    - ``reads_by_range``: it reads every shard's samples itself, by range (local files with ``pread``, remote
      ones through :mod:`feedfast.sources.rangeread`), so a shuffled epoch keeps the global order over
      shards whose kind reads single samples cheaply (:func:`~feedfast.order.deal.partition_for`);
    - ``sources``: the kinds of dataset it reads (``source_kind``: ``shards``; ``folder``, images read in place,
      :mod:`feedfast.sources.folder`);
    - ``skips_as_read``: a sample that fails as it is read is a counted skip under ``on_error: skip`` (a dataset
      whose images are checked as they are read, ``checks_when_read``, needs it).
    """

    name: ClassVar[str]
    checkpoints: ClassVar[bool] = False
    tunable: ClassVar[tuple[str, ...]] = ("prefetch",)
    stop_at_exit: ClassVar[bool] = False
    pil_program: ClassVar[bool] = False
    cpu_only: ClassVar[bool] = False
    host_normalize: ClassVar[bool] = False
    reads_by_range: ClassVar[bool] = False
    sources: ClassVar[frozenset[str]] = frozenset({"shards"})
    skips_as_read: ClassVar[bool] = True

    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings

    @property
    def worker_processes(self) -> int:
        """Processes it starts per epoch (torch's ``num_workers`` as scripts read it): 0 for thread backends."""
        return 0

    @abstractmethod
    def batches(self, epoch: int, ep: EpochPlan, start: int, checkpoint: str | None) -> Iterator[Batch]:
        """Batches of ``epoch`` from step ``start``; ``checkpoint`` is a state this backend wrote in a Batch
        (taken at step ``start``), or None."""

    def all_in_flight(self) -> bool:
        """Whether every step of the open epoch is being made already, so the next epoch may start now."""
        return False

    def prepare(self, epoch: int) -> None:
        """Start ``epoch``'s first batches ahead of its iteration (dropped if another epoch comes next).

        The producer calls it once per epoch: when :meth:`all_in_flight` first says so, else after the
        epoch's last batch. The default starts nothing.
        """
        del epoch

    def rescued(self) -> list[tuple[str, str, str]]:
        """(shard, key, reason) of every image its decoder failed and another read (delivered re-encoded)."""
        return []

    def runs_on(self, checkpoint: str | None) -> bool:
        """Whether ``checkpoint``, taken after an epoch's last batch, is where the next epoch starts (a pipeline
        that runs on from one epoch into the next: a state taken there carries it)."""
        del checkpoint
        return False

    def check_checkpoint(self, checkpoint: str, epoch: int) -> bool:
        """Refuse (UserError naming ``dali.checkpoint``) a checkpoint this backend cannot restore for ``epoch``;
        False: it need not be restored (the step alone resumes the same batches)."""
        del epoch
        raise UserError(f"cannot resume from this state: field 'dali.checkpoint' holds a checkpoint, and backend "
                        f"{self.name!r} resumes from the step alone (got {len(checkpoint)} characters)")

    def close(self) -> None:  # noqa: B027 - a backend may hold nothing between epochs
        """Release what it holds between epochs (threads, processes, pipelines, pooled memory)."""
