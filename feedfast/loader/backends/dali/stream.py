"""The stream transport: one rank's epoch as a batch callable for DALI's ``external_source``.

Every epoch of the DALI backend is read so, over every kind of shard (DALI's webdataset reader is
not used); the partition is picked by :func:`~feedfast.order.deal.partition_for`:

- local shards under shuffle (``global``): each rank reads its share of one permutation of
  the whole dataset (:mod:`feedfast.order.globalorder`), sample by sample;
- remote shards under shuffle (``block``: http, ``pipe:``, s3, gs): the block shuffle
  (:func:`~feedfast.order.block.block_order`): windows of ``shuffle.window`` consecutive
  samples of every shard are permuted, cut into ranks' contiguous ranges, and each window's
  samples are spread over about ``shuffle.block`` positions, so a batch mixes about
  ``block / window`` windows of as many shards. A window is read in one ranged request and
  kept in memory until its last step is served (about ``block`` samples held);
- unshuffled (``shards``): the samples and their order are those DALI's own reader would yield:
  the shards' (filtered) indexes concatenated, this rank's contiguous range from
  :func:`~feedfast.order.deal.rank_range`.

Step ``j`` holds rows ``j*B .. j*B+B-1`` of the rank's rows, and rows past their end repeat
its last sample (DALI's ``pad_last_batch``), so every step yields a full batch ``B`` and the
loader cuts it to ``EpochPlan.batch_sizes[j]``. With 9 samples on 2 ranks in batches of 2,
unshuffled, rank 0 (samples 0-3) yields ``[0 1] [2 3] [3 3]`` with 2, 2, 0 valid. Every
sample of the rank's share is read exactly once per epoch, deterministic for (seed, epoch,
rank, world), resumable at any step: the feed answers for a step, whatever came before.
(A windowed shuffle of the rank's contiguous range, ``epoch_rows(window=...)``, remains for
comparison: its batches hold a few classes on class-sorted shards.)

The crop window and flips are fed with the samples, drawn per sample as the other backends draw
them (:mod:`feedfast.compile.dali_draws`); the random operators that still draw from DALI's
generator get the seeds they would get after DALI's reader (see ``compile.dali.ReaderConfig``).

Bytes are read per batch (per window when shuffling in windows), per shard, in offset
order, and members less than ``MAX_GAP`` bytes apart are fetched in one read: a batch
or a window of one shard is one ranged request (see :mod:`feedfast.sources.memberread`).
``external_source`` data has no ``source_info``, so :meth:`StreamEpoch.origins` names each
step's samples instead.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

from feedfast.checks.validate import probe_image
from feedfast.compile.dali import dali_components
from feedfast.compile.dali_draws import FedDraws, fed_draws
from feedfast.compile.plan import Plan
from feedfast.errors import ShardError
from feedfast.loader.backends.dali.draws import StepDraws
from feedfast.loader.backends.dali.feed import DALI_HOLDS, BatchFeeder
from feedfast.loader.backends.dali.ring import Ring
from feedfast.order.deal import EpochPlan, step_positions
from feedfast.order.draws import draws_key
from feedfast.order.orders import epoch_rows
from feedfast.shards.index.columnar import Origins
from feedfast.sources.mixture import Dataset


class StreamEpoch:
    """One rank's epoch over the stream transport: the batch callable and each step's origins.

    ``workers`` threads read ``ahead`` steps ahead of the step DALI asks for. ``skip`` (``on_error: skip``): a
    shard that cannot be read mid-epoch loses its rows (:mod:`.lostrows`); a step with rows lost is fed with
    its samples first (see :meth:`origins` and :meth:`lost`). ``fed``: the components DALI takes (None: all);
    host ops read the others through :meth:`host`. ``draws``: the draws DALI is fed (each sample's crop window
    and flips, drawn for this seed and epoch: :mod:`.draws`), None: none. ``holds``, ``ring``, ``ring_base``: see
    :class:`~feedfast.loader.backends.dali.feed.BatchFeeder`.
    """

    def __init__(self, shards: Any, ep: EpochPlan, exts: Sequence[set[str] | frozenset[str]], *, rank: int,
                 world: int, batch_size: int, shuffle_window: int, seed: int, epoch: int, workers: int = 2,
                 ahead: int = 4, skip: bool = False, fed: Sequence[int] | None = None, holds: int = DALI_HOLDS,
                 ring: Ring | None = None, ring_base: int = 0, draws: FedDraws | None = None) -> None:
        # global: local shards under shuffle, read sample by sample; block: remote shards under shuffle,
        # windows of many shards interleaved; shards: unshuffled (or windows of the rank's range)
        rows = epoch_rows(shards, exts, ep, rank=rank, world=world, seed=seed, epoch=epoch,
                          shuffle=ep.partition != "shards", window=shuffle_window if ep.partition == "shards" else 0,
                          block=shards.shuffle)
        if len(rows) != ep.rank_samples:
            raise ShardError(f"rank {rank} has {len(rows)} samples but its epoch plan expects {ep.rank_samples}")
        self.names, self.rows, self.batch_size, self.exts = shards.paths, rows, batch_size, exts
        self.feeder = BatchFeeder(shards.paths, shards.read_kinds, rows,
                                  partial(step_positions, batch_size=batch_size, count=len(rows)), steps=ep.steps,
                                  cache=shards.cache, transfer=shards.transfer, workers=workers, ahead=ahead,
                                  valid=ep.valid if skip else None, dali=fed, holds=holds, ring=ring,
                                  ring_base=ring_base, members=shards.members(exts),
                                  draws=StepDraws(draws, draws_key(seed, epoch)) if draws is not None else None)

    def origins(self, step: int, size: int) -> Origins:
        """(shard, key) of the first ``size`` rows of step ``step`` as fed (a step with rows lost: its samples
        first), read from the index when first asked for; after the step was fed."""
        positions = step_positions(step, self.batch_size, len(self.rows))
        filled = self.feeder.filled.get(step)
        if filled is not None:
            positions = [positions[i] for i in filled.order]
        return Origins(self.rows.index, self.names, self.rows.take(positions[:size]))

    def lost_any(self) -> bool:
        """Whether its feed lost a shard it could not read (under ``on_error: skip``)."""
        return self.feeder.lost is not None and bool(self.feeder.lost.dead)

    def host(self, step: int, component: int) -> Any:
        """Step ``step``'s members of ``component`` (one DALI does not take), as fed: for host ops."""
        return self.feeder.host(step, component)

    def lost(self, step: int) -> tuple[int, tuple[tuple[str, str, str], ...]] | None:
        """Under skip, a step fed with rows lost: its samples left (its batch's ``valid``) and its lost samples as
        (shard, key, reason); None for a step that lost none. After the step was fed."""
        filled = self.feeder.filled.get(step)
        if filled is None or self.feeder.lost is None:
            return None
        where = self.rows.take(list(filled.lost))
        reasons = self.feeder.lost.lost
        named = zip(where.shard.tolist(), self.rows.index.batch_keys(where), filled.lost)
        return filled.valid, tuple((self.names[s], key, reasons[r]) for s, key, r in named)

    def bad_sample(self, step: int, image_exts: list[set[str]], max_pixels: int, *,
                   at: int | None = None) -> tuple[str, str, str] | None:
        """The first sample of step ``step`` (its ``at``-th alone, when given) whose image DALI cannot decode, as
        (shard, key, reason).

        Used after DALI failed a batch: the step is read again and its image components (those whose extensions
        are in ``image_exts``) probed.
        """
        comps = [c for c, exts in enumerate(self.exts) if exts in image_exts]
        arrays = self.feeder.batch(step)
        origins = self.origins(step, self.batch_size)
        for i in range(len(origins)) if at is None else range(at, min(at + 1, len(origins))):
            for c in comps:
                v = probe_image(arrays[c][i].tobytes(), max_pixels=max_pixels)
                if v.status != "ok":
                    return origins[i][0], origins[i][1], v.reason
        return None


def epoch_stream(plan: Plan, shards: Dataset, ep: EpochPlan, *, rank: int, world: int, batch_size: int, seed: int,
                 epoch: int, workers: int = 2, ahead: int = 2, **feed: Any) -> StreamEpoch:
    """This rank's epoch over the stream transport: the samples and order of the epoch's DALI reader (under
    ``on_error: skip``, a shard that cannot be read mid-epoch loses its rows: :mod:`feedfast.sources.lostrows`),
    with the draws the plan's DALI graph takes as data (:func:`~feedfast.compile.dali_draws.fed_draws`).
    ``feed``: the feed's ``holds``, ``ring`` and ``ring_base`` (:class:`StreamEpoch`)."""
    return StreamEpoch(shards, ep, plan.component_exts(), rank=rank, world=world, batch_size=batch_size,
                       shuffle_window=plan.spec.shuffle_buffer, seed=seed, epoch=epoch, workers=workers, ahead=ahead,
                       fed=dali_components(plan), skip=plan.spec.on_error == "skip", draws=fed_draws(plan), **feed)
