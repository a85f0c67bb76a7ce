"""One epoch of one rank through the portable backend: PIL in torch DataLoader workers.

It yields the same :class:`~feedfast.loader.batch.Batch` objects as the DALI path's
``run_life_epoch`` with the same sample assignment: the shards concatenated in
``ep.shard_order``, each shard's samples in the order of the index DALI is given
(``ShardSet.index_paths``: already filtered by :func:`~feedfast.sources.dataset.open_shards`
for ``missing: skip`` and ``on_error: skip``, side shards of re-encoded images included), this rank's
contiguous range from :func:`~feedfast.order.deal.rank_range`, steps, batch sizes and
valid counts from ``ep``, and padding that repeats the rank's last sample at the end of a
batch. With 7 samples on 1 rank in batches of 2, ``pad`` yields ``[s0 s1] [s2 s3] [s4 s5]
[s6 s6]`` (valid 2, 2, 2, 1).

What differs from DALI, by design:

- shuffled, the epoch reads the global order over every shard (``ep.partition == "global"``);
  outside it (``shards``), a permutation of the rank's range fixed by (seed, epoch, rank)
  rather than DALI's buffer shuffle; the guarantees are the same: every sample exactly once
  per epoch, deterministic, and padding repeats the last sample of the shuffled order;
- augmentation draws from a counter-based generator keyed by (seed, epoch, the sample's
  canonical number) (:mod:`~feedfast.order.draws`): results do not depend on the number of
  workers or ranks, and a padded copy equals its original exactly;
- a component with several matching members takes the first in tar order (as DALI's reader
  does); a missing one under ``missing: empty`` arrives as ``b""``.

An image component pillow-simd cannot decode gets a second opinion from DALI's CPU decoder
(:mod:`~feedfast.loader.backends.cpu.second_run`; in a check worker, under ``source.check_seconds``):
what DALI decodes is delivered, in the decode op's colour, as the DALI backend delivers it, and
the sample's program runs again on those pixels with the same draws.

Each batch is built by one worker process (``workers=0``: in this process). A failure in a
worker is re-raised here as the feedfast error it was: whatever a decoder or plugin raises
while processing a sample (any exception class) is a ``SampleError`` naming shard, key and
reason, with the traceback logged at DEBUG level on ``feedfast.pil``. Under
``on_error: skip`` such samples were left out or re-encoded by the check before the epoch
(see :mod:`feedfast.checks.validate`), so a failure here means the check and the decoders disagree.
Warnings PIL gives while decoding (corrupt EXIF, truncated metadata) go to the same logger
at DEBUG level, not to the terminal (:mod:`~feedfast.loader.backends.pil_warnings`: per thread, so
warnings of the training loop's own thread are left alone).
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from feedfast.compile.pil import PilProgram
from feedfast.compile.plan import Plan
from feedfast.errors import BackendError, SampleError, ShardError
from feedfast.loader.backends.cpu.samples import epoch_samples, failure_reason
from feedfast.loader.backends.cpu.second_run import image_decodes, second_raw
from feedfast.loader.backends.dali import convert
from feedfast.loader.backends.pil_warnings import routed
from feedfast.loader.batch import Batch
from feedfast.ops.base import Signature
from feedfast.order.deal import EpochPlan, step_positions
from feedfast.order.draws import SampleDraws, batch_draws
from feedfast.order.rows import Rows
from feedfast.shards.index.columnar import Origins, RowBatch
from feedfast.sources.lostrows import lost_last
from feedfast.sources.members import Members, ShardMembers
from feedfast.sources.mixture import Dataset
from feedfast.sources.rangeread import RangeSource, as_bytes, remote
from feedfast.spec.model import CHECK_SECONDS

log = logging.getLogger("feedfast.pil")


@dataclass(frozen=True)
class _Failure:
    """A worker's failure, as plain data, re-raised in the main process."""

    kind: str
    message: str
    shard: str = ""
    key: str = ""
    reason: str = ""

    def error(self) -> Exception:
        if self.kind == "sample":
            return SampleError(self.message, shard=self.shard, key=self.key, reason=self.reason)
        if self.kind == "shard":
            return ShardError(self.message)
        return BackendError(self.message)


class EpochBatches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Map-style dataset of one rank's epoch: item ``i`` is the whole batch of step ``start + i``."""

    def __init__(self, program: PilProgram, paths: tuple[str, ...], rows: Rows, ep: EpochPlan, *,
                 batch_size: int, seed: int, epoch: int, start: int, check_seconds: float = CHECK_SECONDS,
                 source: RangeSource | None = None, members: Members | None = None,
                 skip_failed: bool = False) -> None:
        self.program, self.paths, self.rows, self.ep = program, paths, rows, ep
        self.batch_size, self.seed, self.epoch, self.start = batch_size, seed, epoch, start
        self.check_seconds = check_seconds
        self.decodes = image_decodes(program)
        self.members = members or ShardMembers(paths)  # pickled as paths (a listing): each worker opens its own
        self.skip_failed = skip_failed  # images in place, checked as read: a sample that fails is lost (skip)
        self.source = source  # remote shards: a batch's members read by range (sources/rangeread.py), per process
        self.spare: dict[str, Any] | None = None  # a sample of this process's last batch: fills a batch all lost

    def __len__(self) -> int:
        return max(0, self.ep.steps - self.start)

    def __getitem__(self, i: int) -> Batch | _Failure:
        step = self.start + i
        rows = step_positions(step, self.batch_size, self.ep.rank_samples, self.ep.batch_sizes[step])
        batch = self.rows.take(rows)
        origins = Origins(self.rows.index, self.paths, batch)
        draws = batch_draws(seed=self.seed, epoch=self.epoch, samples=batch.draw_ids)
        try:  # remote shards: the batch's members in ranged reads (merged where near), before its decoding
            columns = self.source.read(rows) if self.source is not None else None
        except ShardError as exc:
            return _Failure("shard", str(exc))
        lost = {i: self.source.lost[r] for i, r in enumerate(rows) if r in self.source.lost} \
            if self.source is not None and self.source.lost else {}
        per_sample: list[dict[str, Any] | None] = []
        for i in range(len(rows)):
            if i in lost:
                per_sample.append(None)
                continue
            raw = None if columns is None else [as_bytes(column[i]) for column in columns]
            out = self._sample(batch, i, origins, draws[i], raw)
            if isinstance(out, _Failure) and out.kind == "sample" and self.skip_failed:
                lost[i] = out.reason  # left out and counted, as a lost row
                per_sample.append(None)
                continue
            if isinstance(out, _Failure):
                return out
            per_sample.append(out)
        names, valid = list(origins), self.ep.valid[step]  # read here: the batch goes to another process
        skipped: tuple[tuple[str, str, str], ...] = ()
        if lost:
            order, fill, kept = lost_last(len(rows), valid, lost)
            spare = per_sample[fill] if fill is not None else self.spare or self._zeros(names[order[0]], lost)
            if isinstance(spare, _Failure):
                return spare
            skipped = tuple((*names[i], lost[i]) for i in range(valid) if i in lost)
            per_sample = [spare if i in lost else per_sample[i] for i in order]
            names, valid = [names[i] for i in order], kept
        if valid:
            self.spare = per_sample[0]
        fields = {name: _collate([s[name] for s in per_sample], sig)  # type: ignore[index]
                  for name, sig in self.program.signatures.items()}
        return Batch(fields, names, valid, lost=skipped)

    def _zeros(self, origin: tuple[str, str], lost: dict[int, str]) -> dict[str, Any] | _Failure:
        """What fills a lost row when no sample of the epoch came before it in this process: each output's zeros
        (a label 0), where the spec fixes its shape; else a failure naming the shard."""
        out: dict[str, Any] = {}
        for name, sig in self.program.signatures.items():
            shape = tuple(d for d in sig.shape if d is not None)
            if sig.kind in ("image", "tensor") and (not sig.shape or len(shape) != len(sig.shape)):
                return _Failure("shard", f"shard {origin[0]!r} cannot be read ({next(iter(lost.values()))}), and "
                                         f"output {name!r} has no fixed shape to fill its rows with before a sample "
                                         "of the epoch was read")
            if sig.kind == "image":
                out[name] = np.zeros(shape, dtype=np.uint8)
            elif sig.kind == "tensor":
                out[name] = torch.zeros(shape, dtype=getattr(torch, sig.dtype))
            else:
                out[name] = 0 if sig.kind == "label" else None
        return out

    def _sample(self, batch: RowBatch, i: int, origins: Origins, draws: SampleDraws,
                raw: list[bytes] | None = None) -> dict[str, Any] | _Failure:
        number = int(batch.shard[i])
        shard = self.paths[number]
        try:
            if raw is None:
                raw = self.members.sample(batch, i)
        except ShardError as exc:
            return _Failure("shard", str(exc))
        except SampleError as exc:  # a file read in place is missing or changed: named
            return _Failure("sample", "the PIL backend could not read a sample", exc.shard, exc.key, exc.reason)
        try:
            with routed(origins.lazy(i)):
                try:
                    return self.program.run(raw, draws)
                except Exception as exc:  # noqa: BLE001 - any decoder failure asks DALI about the images
                    second = self._second(raw, draws, exc)
                    if second is None:
                        raise
                    return second
        except Exception as exc:  # noqa: BLE001 - whatever a decoder or plugin raises names the sample
            key = origins[i][1]
            return _Failure("sample", "the PIL backend could not process a sample", shard, key,
                            failure_reason(exc, shard, key))

    def _second(self, raw: list[bytes], draws: SampleDraws, exc: Exception) -> dict[str, Any] | None:
        """The sample's outputs with DALI's pixels for each image PIL cannot decode, from the same draws;
        None when PIL decodes every image (the failure is elsewhere).

        Raises:
            DecodeFailure: DALI cannot decode such an image either (both decoders' reasons).
        """
        fixed = second_raw(self.program, raw, exc, seconds=self.check_seconds, decodes=self.decodes)
        return None if fixed is None else self.program.run(fixed, draws.replay())

    def close(self) -> None:
        """Close the shard files this process opened, and its remote reader."""
        self.members.close()
        if self.source is not None:
            self.source.close()


def _collate(values: list[Any], sig: Signature) -> Any:
    """A batch of one field: images and tensors stacked (specs declare them fixed-size), host values collated."""
    if sig.kind == "image":
        return torch.stack([_pixels(v) for v in values])
    if sig.kind == "tensor":
        return torch.stack(values)
    return convert.collate(values, sig.kind)


def _pixels(img: Any) -> torch.Tensor:
    arr = np.array(img, dtype=np.uint8)  # a writable copy, HW or HWC
    return torch.from_numpy(arr[:, :, None] if arr.ndim == 2 else arr)


def _identity(item: Any) -> Any:
    return item


def _start_workers(loader: torch.utils.data.DataLoader) -> Iterator[Any]:  # type: ignore[type-arg]
    """``iter(loader)``, which forks its worker processes, with this process's objects frozen for the cyclic GC.

    Objects that are garbage here but not yet collected (a dropped DataLoader of the DALI backend,
    say) would otherwise be collected in a worker, and a DALI pipeline's destructor in a forked
    child waits forever on threads that did not fork with it (seen: a worker hung in
    ``Executor2::~Impl``). Frozen objects are never collected in the children; here they are
    unfrozen as soon as the workers run.
    """
    gc.freeze()
    try:
        return iter(loader)
    finally:
        gc.unfreeze()


def run_pil_epoch(plan: Plan, shards: Dataset, ep: EpochPlan, *, rank: int, world: int, batch_size: int,
                  workers: int, seed: int, epoch: int, start: int = 0, prefetch_factor: int = 2,
                  program: PilProgram | None = None) -> Iterator[Batch]:
    """Yield this rank's batches of the epoch from step ``start`` on, computed with PIL.

    Args:
        plan: the loader's plan; its spec is recompiled for this backend (unfused, CPU).
        shards: the opened shards: the (filtered) indexes and sizes ``open_shards`` gives DALI.
        ep: this rank's epoch plan (shard order, steps, batch sizes, valid counts).
        rank, world: this rank and the world size.
        batch_size: the spec's batch size (the stride of steps in the rank's samples).
        workers: DataLoader worker processes; 0 builds batches in this process.
        seed, epoch: fix the shuffle and every sample's augmentation.
        start: the first step to yield (resume).
        prefetch_factor: batches each worker prepares ahead.
        program: the plan's spec as a PIL program, compiled once by the backend (None: compiled here).

    Raises:
        BackendError: an op has no PIL form (raised by the first ``next``, before any data is
            read; call :func:`~feedfast.compile.pil.compile_pil` earlier to fail sooner), or a
            worker failed.
        SampleError: a sample could not be decoded; names the shard and key.
        ShardError: a shard or its index cannot be read.
    """
    program, rows = epoch_samples(plan, shards, ep, rank=rank, world=world, seed=seed, epoch=epoch, program=program)
    source = RangeSource(shards.paths, shards.read_kinds, rows, cache=shards.cache, transfer=shards.transfer,
                         windows=workers == 0,  # a worker process sees some of the steps
                         skip=plan.spec.on_error == "skip") if remote(shards.read_kinds) else None
    data = EpochBatches(program, shards.paths, rows, ep, batch_size=batch_size, seed=seed, epoch=epoch, start=start,
                        check_seconds=plan.spec.check_seconds, source=source, members=shards.members(program.exts),
                        skip_failed=shards.checks_when_read)
    loader = torch.utils.data.DataLoader(
        data, batch_size=None, shuffle=False, num_workers=workers, collate_fn=_identity,
        prefetch_factor=prefetch_factor if workers > 0 else None,
    )
    batches = _start_workers(loader)
    try:
        for item in batches:
            if isinstance(item, _Failure):
                raise item.error()
            yield item
    finally:
        del batches  # stops the workers
        data.close()
