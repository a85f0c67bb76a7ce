"""``feedfast.DataLoader``: a drop-in for ``torch.utils.data.DataLoader`` over tar shards or image folders."""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - imported first, so its exit hook runs after ours
import os
import threading
import weakref
from typing import Any, Iterator, Sequence

import torch

from feedfast import _env
from feedfast.compile.build import build_plan, lower
from feedfast.compile.passes import forced_onto_gpu
from feedfast.compile.plan import Plan
from feedfast.errors import FeedfastError, UserError
from feedfast.loader.accelerate_state import AccelerateEpoch
from feedfast.loader.autotune import Tuner, budget_batches
from feedfast.loader.backends.base import Backend, BackendSettings
from feedfast.loader.backends.choose import backend_type, choose_backend, make_backend
from feedfast.loader.backends.dali.pipe import CHECKPOINT_EVERY
from feedfast.loader.batch import batch_info
from feedfast.loader.batchmix_stage import mix_stage
from feedfast.loader.deliver import Delivered, Delivery
from feedfast.loader.devices import DeviceLayer, layer_for, route_here
from feedfast.loader.epochs import Dataset, EpochData
from feedfast.loader.options import check_pin_memory_device, check_torch_kwargs, rank_cores, settle_spec
from feedfast.loader.producer import Ahead
from feedfast.loader.ring import PinnedRing
from feedfast.loader.settings import loader_settings
from feedfast.loader.state import Identity, LoaderState, ResumePoint, parse_state, spec_digest
from feedfast.loader.torchcompat import TorchAttributes
from feedfast.order.deal import EpochPlan
from feedfast.spec.load import load_spec

_LIVE: "weakref.WeakSet[DataLoader]" = weakref.WeakSet()


def _close_live_loaders() -> None:
    """At interpreter exit, before Python joins its threads: stop the background work of backends that say so.

    Its producer thread and a next epoch started ahead would otherwise still decode in native
    code while the interpreter tears down (a process aborted once with "terminate called without
    an active exception"). DALI-backed loaders are left to their finalizers, as before: destroying
    DALI pipelines at this point aborted with a ``std::system_error``.
    """
    for loader in list(_LIVE):
        if not loader._backend.stop_at_exit:
            continue
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - nothing to report to at exit; the process is ending
            continue


if hasattr(threading, "_register_atexit"):  # runs before Python joins non-daemon threads (pools)
    threading._register_atexit(_close_live_loaders)


class DataLoader(TorchAttributes):
    """Batches from WebDataset shards through a compiled spec, used like torch's DataLoader.

    Args:
        spec: a spec file path, a mapping, or a :class:`feedfast.spec.Spec`.
        shards: shard paths, globs, brace patterns, ``@list.txt``, a :class:`feedfast.Mix` of
            weighted datasets, or URLs: ``file://``,
            ``http(s)://`` and ``pipe:CMD`` (streamed; see :mod:`feedfast.loader.backends.dali.stream`),
            ``s3://`` and ``gs://`` (DALI's reader; see :mod:`feedfast.sources.dataset`).
            Or images in place: an image folder (``"data/train/"``, torchvision's ``ImageFolder`` layout: its
            classes, labels and order, ``loader.dataset.classes``) or a file list (``train.txt`` of ``path label``
            lines, ``train.csv``), read on every backend (:mod:`feedfast.sources.folder`).
        batch_size: overrides the spec's batch size.
        shuffle: True reads every epoch in a new uniform permutation of the whole dataset over
            local shards (:mod:`feedfast.order.globalorder`; a state then resumes at any world
            size), and in a block shuffle of windows of every shard over remote shards
            (``shuffle.block``, ``shuffle.window``; a state resumes at the same world size).
        drop_last: True drops incomplete batches (``last_batch: drop``).
        num_workers: CPU threads of the ``dali`` and ``threads`` backends (0 means 1), worker
            processes of the ``pil`` backend; default: the spec's ``loader.threads``, else this
            rank's share of the usable cores (divided by ``LOCAL_WORLD_SIZE``: ranks on one node
            share them).
        pin_memory: stage CUDA copies in pinned memory (default True).
        pin_memory_device: torch's meaning: the device pinned memory serves; "" or the
            delivery device's type (it never moves batches: use ``device``).
        prefetch_factor: batches made ahead of the training step on the loader's background
            thread, and DALI's queue depth (default: the spec's ``loader.prefetch``, else 2).
        seed: overrides the spec's seed (order and augmentation).
        device: where batches are delivered: ``cpu``, ``cuda`` (this rank's GPU: ``LOCAL_RANK``
            under torchrun, else the current device) or ``cuda:N``. Default: the rank's GPU
            when the pipeline runs on the GPU, else the CPU.
        placement: where the pipeline runs: ``auto``, ``cpu`` or ``gpu`` (default: the spec's).
            How the two combine is one rule, documented in :mod:`feedfast.loader.devices`.
        last_batch: ``partial``, ``pad`` or ``drop`` (see :mod:`feedfast.order.deal`).
        rank, world_size: default from torch.distributed, else RANK/WORLD_SIZE.
        overrides: ``key.path=value`` spec overrides.
        cache_dir: where indexes go when a shard's folder is read-only.
        on_error: ``raise`` (default: the spec's) or ``skip``: check images once and leave
            undecodable ones out, counted (see :mod:`feedfast.checks.validate`).
        max_pixels: images with more pixels are bad (default 89,478,485, PIL's limit).
        backend: ``auto`` (default, unless the spec's ``loader.backend`` says otherwise):
            ``threads`` for a CPU-placed plan over local shards whose
            ops the threaded path runs, else ``dali``; ``dali``; ``threads`` (pillow-simd in
            threads, reduced-size JPEG decode); or ``pil`` (PIL in torch DataLoader worker
            processes, the portable backend). See :mod:`feedfast.loader.backends.choose`.
        cache_limit: bytes the cache of whole remote shards (``pipe:`` shards, and http
            ones under ``on_error='skip'``) may hold; least recently used go first
            (default: no limit; see :mod:`feedfast.shards.transport.cache`).
        remote_retries: retries of a failed remote read (default 3, backoff 0.5 s doubling).
        remote_timeout: seconds one remote fetch (a ranged read, a shard's download, a ``pipe:``
            command's run), its retries included, may take, plus its bytes at 256 KB/s (default 60);
            past it the fetch is cut (a ``pipe:`` command killed) and is a RemoteError naming the shard.
        sample_info: give each batch a :class:`~feedfast.loader.batch.BatchInfo` (its
            samples' shards and keys, the padding mask, the state to resume after it): the
            last element of a tuple batch, or ``batch["sample_info"]`` of a dict batch.
        tune: search the loader's threads and batches ahead during the first batches, by the
            measured period of the loop it feeds (default: the spec's ``tune.enabled``); the
            data do not change. See :mod:`feedfast.loader.autotune` and :meth:`tuning`.
        collate_fn: a batch hook, ``collate_fn(batch) -> batch``: each finished batch (the tuple or
            dict the loader would yield; ``sample_info`` is added after) goes through it on the
            producer thread, ahead of the training step, and what it returns is yielded. It keeps
            the batch's samples. Not torch's per-sample collate: see :mod:`feedfast.loader.batchhook`.
        **torch_kwargs: other torch DataLoader arguments; see :mod:`feedfast.loader.options`.

    Batches are a tuple (spec ``outputs`` as a list) or a dict (as a mapping) of tensors.
    The attributes torch scripts read (``dataset``, ``sampler``, ``batch_sampler``,
    ``batch_size``, ``drop_last``, ``num_workers``, ``pin_memory``, ``prefetch_factor``,
    ``persistent_workers``, ``timeout``, ``collate_fn``, ``generator``) have torch's meaning:
    see :mod:`feedfast.loader.torchcompat`.

    Epochs: ``iter(loader)`` runs the epoch ``set_epoch``/``load_state_dict`` chose, else the
    one after the last epoch iterated. An iteration that stops before its epoch's end (a
    ``break``, ``islice(loader, 3)``, an error) ends that epoch, as a torch DataLoader's
    iterator does: the next ``iter()`` runs the next epoch, in its own order (torch draws a new
    permutation per ``iter()``), unless ``set_epoch`` or ``load_state_dict`` came between;
    ``state_dict()`` taken before then still resumes where the stopped iteration was.
    """

    def __init__(
        self, spec: Any, *, shards: str | os.PathLike[str] | Sequence[str], batch_size: int | None = None,
        shuffle: bool | None = None, drop_last: bool | None = None, num_workers: int | None = None,
        pin_memory: bool = True, prefetch_factor: int | None = None, seed: int | None = None,
        device: str | torch.device | None = None, placement: str | None = None, last_batch: str | None = None,
        rank: int | None = None, world_size: int | None = None, overrides: Sequence[str] = (),
        cache_dir: str | os.PathLike[str] | None = None, pin_memory_device: str | None = None,
        on_error: str | None = None, max_pixels: int | None = None, backend: str | None = None,
        cache_limit: int | None = None, remote_retries: int | None = None, remote_timeout: float | None = None,
        sample_info: bool = False, tune: bool | None = None, collate_fn: Any = None, **torch_kwargs: Any,
    ) -> None:
        check_torch_kwargs(torch_kwargs)
        settings = loader_settings(
            settle_spec(load_spec(spec, overrides), batch_size, shuffle, drop_last, last_batch, seed),
            num_workers=num_workers, pin_memory=pin_memory, prefetch_factor=prefetch_factor, device=device,
            placement=placement, rank=rank, world_size=world_size, cache_dir=cache_dir,
            pin_memory_device=pin_memory_device, on_error=on_error, max_pixels=max_pixels, backend=backend,
            cache_limit=cache_limit, remote_retries=remote_retries, remote_timeout=remote_timeout,
            sample_info=sample_info, tune=tune, collate_fn=collate_fn, timeout=torch_kwargs.get("timeout", 0))
        self.settings = settings
        self.spec, self.threads, self.prefetch, self.knobs = settings.spec, settings.threads, settings.prefetch, \
            settings.knobs
        self.rank, self.world, self.sample_info = settings.rank, settings.world, settings.sample_info
        self.max_pixels, self._cache_dir = settings.max_pixels, settings.cache_dir
        # the plan: where it runs (the device rule) and for which consumer; a backend asked for by name says
        # what it needs of the plan (a PIL program checked now, not mid-epoch; CPU placement; host normalize)
        kind = backend_type(settings.backend)
        if kind is not None and kind.pil_program:
            from feedfast.compile.pil import compile_pil

            compile_pil(self.spec)
        cpu_only = kind is not None and kind.cpu_only
        route = route_here(self._placement("cpu" if cpu_only else settings.placement or self.spec.device),
                           settings.device)
        self.device = route.device
        check_pin_memory_device(settings.pin_memory_device, self.device.type)
        self.device_id = route.device_id  # DALI's GPU: the same index as the output tensors and streams
        consumer = "cpu" if kind is not None and kind.host_normalize else self.device.type
        self.plan: Plan = build_plan(self.spec, device=route.placement, consumer=consumer)
        # the stages: the data of each epoch, the backend, the delivery (ring slots: the producer's queue as
        # deep as a tuner may make it, the batch being made, and a spare), the tuner
        self.data = EpochData(shards, self.spec, self._cache_dir, settings.open_kw, rank=self.rank, world=self.world)
        self.shards: Dataset = self.data.shards
        self.data.check_size(self.plan)
        self.backend = choose_backend(settings.backend, self.plan, self.shards)
        chosen = backend_type(self.backend)
        if chosen is not None and chosen.reads_by_range:  # the global order over more kinds of shard
            self.data.read_by_range()
        if self.spec.repeats > 1 and self._partition != "global":
            raise UserError(f"shuffle.repeats={self.spec.repeats} (repeated augmentation) needs the global order: "
                            "a shuffled epoch, over local shards or on the threads or pil backend, and this one is "
                            f"{self._partition!r} ({'not shuffled' if self._partition == 'shards' else 'remote shards on dali'}); "
                            "pass shuffle=True (backend='threads' or 'pil' for remote shards), or remove shuffle.repeats")
        self._batch_mix = mix_stage(self.spec, self.plan, rank=self.rank, world=self.world)
        self._backend: Backend = make_backend(self.backend, self._backend_settings())
        self.data.build_row_index(self.plan)  # every backend reads the dataset's rows itself
        self.delivery = Delivery(self._layer(), depth=self.knobs.max_prefetch + 2, pin=settings.pin_memory,
                                 deferred=self.plan.deferred_outputs(), outputs=tuple(self.spec.outputs),
                                 form=self.spec.output_form, hook=settings.hook)
        self.epoch = 0
        self._resume: ResumePoint | None = None  # where the next iteration starts, from load_state_dict
        self._chosen = False  # set_epoch or load_state_dict chose the next iteration's epoch
        self._ep: EpochPlan | None = None  # the plan of the iteration in progress
        self._stats = {"delivered": 0, "skipped": len(self.shards.skipped), "padded": 0, "dropped": 0, "batches": 0}
        self.last_origins: list[tuple[str, str]] = []
        self.last_valid = 0
        self._lost: list[tuple[str, str, str]] = []  # samples skipped mid-epoch (a shard unreadable, under skip)
        self._step = 0
        # the backend's last checkpoint at or before the last batch handed to the caller: (its step, checkpoint)
        self._anchor: tuple[int, str | None] = (0, None)
        self._producer: Ahead[Delivered] | None = None  # the background thread of the open epoch
        self._open = False  # an epoch was started and not closed
        self._tuner: Tuner | None = None
        if settings.tune:  # the threaded path changes its threads live; the others tune their batches ahead
            self._tuner = Tuner(self.knobs, cores=rank_cores(), tunable=self._backend.tunable,
                                budget=budget_batches(self.spec.tune.budget, len(self)))
        # what a state must match, computed once (a state is taken per batch under sample_info)
        self._digests = (self.data.digest, spec_digest(self.spec.to_dict()))
        _LIVE.add(self)

    @property
    def _partition(self) -> str:
        """How epochs are partitioned over ranks (the data stage's: ``shards``, ``global`` or ``block``)."""
        return self.data.partition

    @property
    def ring(self) -> PinnedRing:
        """The delivery stage's pinned ring (its slots, side stream and counts)."""
        return self.delivery.ring

    def _placement(self, requested: str) -> str:
        """Where the pipeline runs: ``requested``, or ``gpu`` when the spec forces an op onto the GPU (the plan
        is then GPU-placed whatever was asked, and the delivery rule and DALI's ``device_id`` must follow it)."""
        forced = forced_onto_gpu(lower(self.spec))
        if not forced or requested == "gpu":
            return requested
        if not _env.cuda_available():
            raise UserError(f"{forced[0]} has device: gpu, which needs a usable CUDA device and torch sees none: "
                            f"remove its device: gpu (or set it to auto), or run on a machine with CUDA")
        return "gpu"

    def _backend_settings(self) -> BackendSettings:
        """What the backend is built from (see :mod:`feedfast.loader.backends.base`)."""
        # DALI's checkpoint costs (on a GPU a device read-back): every batch only when each batch carries its
        # state (sample_info), else every CHECKPOINT_EVERY batches, and a resume steps forward from the last
        return BackendSettings(
            plan=self.plan, shards_for=self.shards_for, plan_for=self.epoch_plan, rank=self.rank, world=self.world,
            batch_size=self.spec.batch_size, seed=self.spec.seed, threads=self.threads,
            workers=self.settings.workers, prefetch=self.prefetch, knobs=self.knobs, device_id=self.device_id,
            max_pixels=self.max_pixels, checkpoint_every=1 if self.sample_info else CHECKPOINT_EVERY)

    def _layer(self) -> DeviceLayer:
        """The device layer of the batches' device (tests replace it with a stand-in)."""
        return layer_for(self.device)

    def shards_for(self, epoch: int) -> Dataset:
        """The epoch's dataset: the shards, or under a :class:`Mix` that epoch's draw."""
        return self.data.shards_for(epoch)

    def epoch_plan(self, epoch: int | None = None, consumed: int = 0) -> EpochPlan:
        """This rank's plan for an epoch (default: the current one); ``consumed``: samples of its global order
        taken before an elastic resume."""
        return self.data.plan(self.epoch if epoch is None else epoch, consumed)

    def __len__(self) -> int:
        """Batches this rank yields per epoch (the same on every rank)."""
        return self.epoch_plan().steps

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration runs (shard order and augmentation follow it).

        After ``load_state_dict``, setting the same epoch keeps the resume point, so the usual
        ``for e in range(start, n): loader.set_epoch(e)`` loop resumes mid-epoch.
        """
        if epoch < 0:
            raise UserError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self._resume = None  # a resume point belongs to the epoch it was saved in
        self.epoch = epoch  # a prepared pipeline of another epoch is dropped by the next iteration
        self._chosen = True

    def __iter__(self) -> Iterator[Any]:
        """Iterate one epoch: the one set by ``set_epoch``/``load_state_dict`` at the first ``next()``, else the
        next one (after a complete epoch, or one whose iteration stopped early: see the class docstring)."""
        return self._iterate()

    def _batches(self, epoch: int, ep: EpochPlan, point: ResumePoint, hooked: bool) -> Iterator[Delivered]:
        """The epoch's batches from ``point``, made and delivered on the producer thread (:mod:`.producer`).

        The backend starts at the point's checkpoint; the batches from there to the point's step
        were handed out before the state was taken, and are made again and dropped unread. The
        next epoch is started from here only: as soon as the backend has every step of this one
        in flight, else after its last batch (loops go on to the next epoch).
        """
        made = self._backend.batches(epoch, ep, point.checkpoint_step, point.checkpoint)
        started = False
        mix = self._batch_mix
        for delivered in self.delivery.stage(made, skip=point.skip, hooked=hooked,
                                             where=lambda i: f"epoch {epoch}, batch {point.step + i}",
                                             mix=None if mix is None else
                                             lambda d, ring, i: mix(d, ring, epoch, point.step + i)):
            yield delivered  # handed over first: the consumer need not wait out the next epoch's start
            if not started and self._backend.all_in_flight():
                self._backend.prepare(epoch + 1)
                started = True
        if not started:
            self._backend.prepare(epoch + 1)

    def _iterate(self, hooked: bool = True) -> Iterator[Any]:
        # runs at the first next(), like torch's DataLoader: a set_epoch after iter() counts
        if self._stopped_early() and not self._chosen:
            self.epoch += 1  # the stopped iteration ended its epoch, as a torch iterator does
        self._chosen = False
        epoch = self.epoch
        point, self._resume = self._resume or ResumePoint(epoch), None
        ep = self.epoch_plan(epoch, point.consumed)
        self._close_current()
        self._ep = ep
        self._step, self._anchor = point.step, (point.checkpoint_step, point.checkpoint)
        # the producer binds the delivery device before its first CUDA call (a new thread's is device 0)
        producer: Ahead[Delivered] = Ahead(lambda: self._batches(epoch, ep, point, hooked),
                                       depth=self.knobs.prefetch, name=f"feedfast-rank{self.rank}-epoch{epoch}",
                                       timeout=self.settings.wait_s, setup=self.delivery.bind_thread)
        self._producer, self._open = producer, True
        tuner, fresh = self._tuner, True
        accelerate = AccelerateEpoch()  # Accelerate's gradient accumulation learns where the epoch ends
        try:
            while True:
                asked = tuner.asked() if tuner is not None and not tuner.done else None
                try:
                    delivered = next(producer)
                except StopIteration:
                    break
                if asked is not None and tuner is not None:
                    tuner.got(asked, fresh)
                    producer.resize(self.knobs.prefetch)
                fresh = False
                batch = delivered.batch
                if batch.before is not None:  # where the backend's pipeline stood when this epoch began
                    self._anchor = (self._step, batch.before)
                self._step += 1
                if batch.checkpoint is not None:
                    self._anchor = (self._step, batch.checkpoint)
                self._count(batch, ep)
                if self._step == ep.steps:  # the epoch is complete once its last batch is out
                    self.epoch = epoch + 1
                    self._stats["dropped"] += ep.dropped
                    accelerate.last_batch()
                info = batch_info(batch.origins, batch.valid, epoch, self._step - 1, self.state_dict()) \
                    if self.sample_info else None  # loader.dataset splits it into its samples (torchcompat.rows)
                yield self.delivery.hand_over(delivered, info)
            if producer.stopped:
                raise FeedfastError("this iterator was stopped: a newer iter(loader) or close() ended its epoch "
                                    "(as with torch, iterate one iterator at a time; state_dict() still holds "
                                    "where it stopped)")
        finally:
            accelerate.close()
            producer.close()  # an abandoned iteration stops making batches; its state stays readable

    def _stopped_early(self) -> bool:
        """Whether the last iteration stopped inside its epoch (a break, ``islice``, an error)."""
        return self._open and self._ep is not None and 0 < self._step < self._ep.steps

    def _count(self, batch: Any, ep: EpochPlan) -> None:
        size = len(batch.origins)
        self._stats["delivered"] += batch.valid
        self._stats["padded"] += size - batch.valid
        self._stats["skipped"] += len(batch.lost)
        self._lost.extend(batch.lost)
        self._stats["batches"] += 1
        self.last_origins, self.last_valid = batch.origins, batch.valid

    def stats(self) -> dict[str, int]:
        """Counts so far: ``delivered``, ``skipped``, ``padded``, ``dropped``, ``batches``.

        ``skipped`` counts samples left out of the dataset once (missing components under
        ``missing: skip``; undecodable images, and labels, JSON or ``.npy`` components their
        ops refuse, under ``on_error: skip``), and those skipped mid-epoch, each time it happens (under
        ``on_error: skip``, the samples of a remote shard that could not be read again after the shard cache
        evicted it: their rows are filled and counted in ``padded``); ``converted``
        counts images re-encoded for DALI (they are delivered): found at construction, or
        when DALI's decoder failed a batch and PIL read them (:meth:`rescued_samples`).
        Samples read per epoch = delivered + dropped (+ those skipped mid-epoch), with padding counted apart.
        """
        return {**self._stats, "converted": len(self.shards.converted) + len(self.rescued_samples())}

    def rescued_samples(self) -> list[dict[str, str]]:
        """Every image DALI's decoder failed mid-epoch and PIL read, delivered re-encoded: shard, key, reason
        (see :mod:`feedfast.loader.backends.dali.rescue`)."""
        return [{"shard": s, "key": k, "reason": r} for s, k, r in self._backend.rescued()]

    def skipped_samples(self) -> list[dict[str, str]]:
        """Every sample left out, with its shard, key and reason (those skipped mid-epoch each time it happened,
        an interrupted run's too when resumed from its state)."""
        return [{"shard": s, "key": k, "reason": r} for s, k, r in (*self.shards.skipped, *self._lost)]

    def tuning(self) -> dict[str, Any]:
        """The tuner's report: its trials (measured and predicted periods), model, decision and reason.

        ``{"state": "off"}`` when the loader does not tune; ``state`` is ``searching`` until the
        decision, then ``done``. See :mod:`feedfast.loader.autotune`.
        """
        return self._tuner.report() if self._tuner is not None else {"state": "off"}

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state to resume from: epoch, step, seed, the backend's checkpoint, counts (see
        :mod:`feedfast.loader.state` for its fields).

        It describes the point after the last batch handed to the caller, however many
        batches the loader made ahead. Taken after an epoch's last batch, it points at the
        start of the next epoch.
        """
        return self._state().to_dict()

    def _state(self) -> LoaderState:
        ep = self._ep if self._open and self._ep is not None else self.epoch_plan()
        mid = self._open and 0 < self._step < ep.steps
        global_order = mid and ep.partition == "global"
        consumed = ep.consumed + self._step * self.world * self.spec.batch_size if global_order else 0
        ended = self._open and self._step == ep.steps and self._anchor[0] == ep.steps
        if ended and self._backend.runs_on(self._anchor[1]):  # the next epoch starts where the pipeline stands
            resume = ResumePoint(self.epoch, 0, 0, self._anchor[1], 0)
        elif not mid:
            resume = ResumePoint(self.epoch)
        elif self._backend.checkpoints:
            resume = ResumePoint(self.epoch, self._step, consumed, self._anchor[1], self._anchor[0])
        else:  # a backend whose randomness is per sample resumes from the step alone
            resume = ResumePoint(self.epoch, self._step, consumed, None, self._step)
        identity = Identity(self.spec.seed, self.rank, self.world, self.spec.batch_size, self._partition,
                            *self._digests)
        tuned = self.knobs.as_dict() if self._tuner is not None and self._tuner.done else None
        return LoaderState(resume, identity, self.backend, self.stats(), tuned, tuple(self._lost))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields what the interrupted run would have yielded next.

        Under ``shuffle=True`` over local shards (the global order), a state is a cursor into
        the epoch's order: any rank's state resumes any rank, at another world size, batch size
        or worker count, with no sample lost or repeated for the rest of the epoch (and the
        same global sequence when ``world * batch_size`` is unchanged). Otherwise the state
        resumes the same rank, world size and batch size only.

        Raises:
            UserError: the state cannot be honoured here (what differs), or it is damaged,
                truncated, tampered with or foreign (the field that is wrong); nothing changes then.
        """
        parsed = parse_state(state)
        saved = parsed.identity
        elastic = saved.partition == "global" == self._partition
        parsed.check_matches(seed=self.spec.seed, rank=saved.rank if elastic else self.rank,
                             world=saved.world_size if elastic else self.world,
                             batch_size=None if elastic else self.spec.batch_size,
                             shards=self._digests[0], spec=self._digests[1])
        if parsed.backend != self.backend:
            raise UserError(f"this state was taken with backend={parsed.backend!r} and this loader uses "
                            f"{self.backend!r}: the two draw different orders and augmentations; pass "
                            f"backend={parsed.backend!r} to resume it")
        r = parsed.resume
        same = (saved.rank, saved.world_size, saved.batch_size) == (self.rank, self.world, self.spec.batch_size)
        if elastic and not (same and r.consumed == r.step * self.world * self.spec.batch_size):
            point = ResumePoint(r.epoch, consumed=r.consumed)  # a cursor into the epoch's global order
        else:
            point = ResumePoint(r.epoch, r.step, 0, r.checkpoint, r.checkpoint_step)
        self._check_point(point)
        if point.checkpoint is not None and not self._backend.check_checkpoint(point.checkpoint, point.epoch):
            point = ResumePoint(point.epoch, point.step)  # the step alone resumes the same batches
        self.epoch = r.epoch
        self._chosen = True
        self._stats = dict(parsed.stats)
        self._lost = list(parsed.lost)  # the interrupted run's mid-epoch skips, named by skipped_samples()
        self._resume = point if point.step or point.consumed or point.checkpoint is not None else None
        if self._tuner is not None and parsed.tuner is not None:  # a resumed tuned run keeps its settings
            self._tuner.pin(parsed.tuner["threads"], parsed.tuner["prefetch"], "resumed with the tuned settings")

    def _check_point(self, point: ResumePoint) -> None:
        """A resume point's cursor and step must lie inside its epoch here (UserError naming the field)."""
        total = sum(self.shards_for(point.epoch).sizes)
        if point.consumed >= total:
            raise UserError(f"cannot resume from this state: field 'consumed' must be an integer in [0, {total}) "
                            f"(the samples of an epoch here), got {point.consumed}")
        steps = self.epoch_plan(point.epoch, point.consumed).steps
        if point.step >= max(1, steps):
            raise UserError(f"cannot resume from this state: field 'step' must be an integer in [0, {steps}) "
                            f"(the batches of epoch {point.epoch} here), got {point.step}")

    def close(self) -> None:
        """Stop the background thread, release the backend's pipelines and pooled memory (iteration can start again)."""
        self._close_current()
        self._backend.close()

    def _close_current(self) -> None:
        producer, self._producer, self._open = self._producer, None, False
        if producer is not None:
            producer.close()  # the producer destroys its pipeline on its way out

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer at interpreter exit
            return

