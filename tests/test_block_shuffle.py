"""The block shuffle of remote shards: the pure order, its spec keys, the feed's windows, and epochs over
http (a server on 127.0.0.1) and over a gs:// stand-in (fsspec's local filesystem under the gs scheme)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import feedfast
from feedfast.errors import SpecError, UserError
from feedfast.loader.backends.dali.feed import BatchFeeder
from feedfast.order.block import BlockShuffle, block_order, shard_windows
from feedfast.order.deal import partition_for, plan_epoch, rank_range, step_positions
from feedfast.order.orders import epoch_rows
from feedfast.shards.index.tarindex import load_index, scan_tar
from feedfast.shards.transport.remote import Transfer
from feedfast.sources.dataset import ShardSet
from feedfast.spec.load import load_spec
from tests.helpers import SMALL_SPEC, keys_of_epoch, make_shards
from tests.rangeserver import RangeServer

SIZES = [5, 3, 7, 1, 9, 4]


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize(("block", "window"), [(1, 1), (6, 2), (8, 3), (100, 4), (4, 4)])
def test_every_sample_once_over_the_ranks_in_dalis_counts(world: int, block: int, window: int) -> None:
    parts = [block_order(SIZES, rank=r, world=world, shuffle=BlockShuffle(block, window), seed=3, epoch=1)
             for r in range(world)]
    assert sorted(np.concatenate([p for p, _ in parts]).tolist()) == list(range(sum(SIZES)))
    assert [len(p) for p, _ in parts] == [b - a for a, b in (rank_range(sum(SIZES), r, world) for r in range(world))]
    plans = [plan_epoch(SIZES, batch_size=2, rank=r, world=world, last_batch="partial", partition="block")
             for r in range(world)]
    assert [p.rank_samples for p in plans] == [len(p) for p, _ in parts]
    assert len({p.steps for p in plans}) == 1


def test_windows_are_consecutive_samples_of_one_shard_and_stay_whole_inside_a_rank() -> None:
    starts, lengths = shard_windows(SIZES, 3)
    shard_of = np.searchsorted(np.cumsum(SIZES), starts, side="right")
    ends = starts + lengths - 1
    assert (shard_of == np.searchsorted(np.cumsum(SIZES), ends, side="right")).all()  # no window crosses a shard
    assert lengths.sum() == sum(SIZES) and lengths.max() == 3
    samples, windows = block_order(SIZES, rank=0, world=1, shuffle=BlockShuffle(8, 3), seed=0, epoch=0)
    for w in set(windows.tolist()):
        assert sorted(samples[windows == w].tolist()) == list(range(starts[w], ends[w] + 1))


def test_each_window_is_spread_over_at_most_a_block() -> None:
    sizes = [100] * 20
    for block in (16, 64, 400):
        _, windows = block_order(sizes, rank=0, world=1, shuffle=BlockShuffle(block, 8), seed=1, epoch=0)
        places = {w: np.flatnonzero(windows == w) for w in set(windows.tolist())}
        assert max(p.max() - p.min() for p in places.values()) <= block + 8  # about a block: memory stays bounded


def test_the_order_is_fixed_by_seed_and_epoch_and_changes_with_them() -> None:
    def order(seed: int, epoch: int) -> list[int]:
        return block_order(SIZES, rank=0, world=2, shuffle=BlockShuffle(8, 2), seed=seed, epoch=epoch)[0].tolist()

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1) and order(1, 0) != order(2, 0)


def test_batches_on_class_sorted_shards_are_near_a_permutations_with_the_default_sizes() -> None:
    # issue 13's set: 1,000 classes of 100 samples packed in class order, shards of 1,000; batch 256
    samples, _ = block_order([1000] * 100, rank=0, world=1, shuffle=BlockShuffle(), seed=0, epoch=0)
    labels = (samples // 100).reshape(-1, 256)[:-1] if len(samples) % 256 == 0 else \
        (samples[: len(samples) // 256 * 256] // 100).reshape(-1, 256)
    distinct = np.mean([len(set(b.tolist())) for b in labels])
    uniform = 226.2  # 1000 * (1 - prod_i (N - 100 - i) / (N - i)), N = 100,000
    assert distinct >= 0.8 * uniform
    old, _ = block_order([1000] * 100, rank=0, world=1, shuffle=BlockShuffle(1024, 1024), seed=0, epoch=0)
    assert np.mean([len(set(b.tolist())) for b in (old[: len(old) // 256 * 256] // 100).reshape(-1, 256)]) < 0.3 * uniform


def test_partition_for_is_the_one_rule() -> None:
    assert partition_for(("file", "file"), shuffled=False) == "shards"
    assert partition_for(("file", "file"), shuffled=True) == "global"
    for kind in ("http", "cache", "s3", "gs"):
        assert partition_for(("file", kind), shuffled=True) == "block"
        assert partition_for((kind,), shuffled=False) == "shards"


def test_a_block_plan_keeps_the_shards_canonical_and_counts_as_dali() -> None:
    shuffled = plan_epoch(SIZES, batch_size=2, rank=1, world=2, last_batch="pad", shuffle_shards=True,
                          partition="block", epoch=3)
    plain = plan_epoch(SIZES, batch_size=2, rank=1, world=2, last_batch="pad")
    assert shuffled.shard_order == tuple(range(len(SIZES)))
    assert (shuffled.steps, shuffled.batch_sizes, shuffled.valid) == (plain.steps, plain.batch_sizes, plain.valid)


def test_the_spec_keys_are_validated_with_the_key_path_value_and_fix() -> None:
    spec = load_spec({**SMALL_SPEC, "shuffle": {"buffer": 64, "block": 512, "window": 16}})
    assert (spec.shuffle_block, spec.shuffle_window, spec.shuffled) == (512, 16, True)
    assert load_spec(spec.to_dict()).shuffle_block == 512  # printed back out and read again
    default = load_spec({**SMALL_SPEC, "shuffle": True})
    assert (default.shuffle_block, default.shuffle_window) == (BlockShuffle().block, BlockShuffle().window)
    for bad, key, value in (({"block": 0}, "shuffle.block", "0"), ({"window": "big"}, "shuffle.window", "'big'"),
                            ({"window": True}, "shuffle.window", "True"),
                            ({"block": 64, "window": 128}, "shuffle.window", "128")):
        with pytest.raises(SpecError) as err:
            load_spec({**SMALL_SPEC, "shuffle": bad}, )
        text = str(err.value)
        assert key in text and f"got {value}" in text and "fix:" in text, text
    with pytest.raises(SpecError, match=r"shuffle\.blocks.*did you mean `block`"):
        load_spec({**SMALL_SPEC, "shuffle": {"blocks": 8}})


def test_the_feed_reads_each_window_once_and_holds_about_a_block(tmp_path: Path) -> None:
    shards = make_shards(tmp_path, samples=60, per_shard=10)
    idx = tuple(str(load_index(p, tmp_path)[0]) for p in shards)
    sset = ShardSet(tuple(shards), idx, (10,) * 6, cache_dir=str(tmp_path))
    ep = plan_epoch([10] * 6, batch_size=4, rank=0, world=1, last_batch="partial", partition="block")
    rows = epoch_rows(sset, [{"jpg"}, {"cls"}], ep, rank=0, world=1, seed=0, epoch=0, shuffle=True,
                      block=BlockShuffle(12, 3))
    assert rows.window is not None
    steps = 15
    feeder = BatchFeeder(tuple(shards), ("file",) * 6, rows, lambda s: step_positions(s, 4, 60), steps=steps,
                         cache=None, transfer=Transfer(), workers=1, ahead=1)
    reads: list[list[int]] = []
    fetch = feeder.reader._windows._fetch
    feeder.reader._windows._fetch = lambda members: reads.append(members) or fetch(members)
    held = []
    try:
        for step in range(steps):
            _, labels = feeder(step)
            where = rows.take(step_positions(step, 4, 60))
            for i, got in enumerate(labels):  # the bytes of the row's label member
                with open(shards[int(where.shard[i])], "rb") as f:
                    f.seek(int(where.offsets[i, 1]))
                    assert np.asarray(got).tobytes() == f.read(int(where.sizes[i, 1]))
            held.append(feeder.reader._windows.held())
    finally:
        feeder.close()
    samples = rows.samples(np.arange(len(rows)))
    assert sorted(s for members in reads for s in members) == sorted(samples.tolist())  # each window once
    windows = len(set(rows.window.window_of(samples).tolist()))
    assert windows == 24 and len(reads) <= windows  # 6 shards of 10 in windows of 3; neighbours wanted at once merged
    assert max(held) <= 12 // 3 + 4  # the block's windows and those of the steps read ahead


def _block_keys(loader: feedfast.DataLoader, local: list[str], epoch: int) -> list[str]:
    """The keys the pure block order gives for the loader's settings."""
    spec, shards = loader.spec, loader.shards
    samples, _ = block_order(shards.sizes, rank=loader.rank, world=loader.world,
                             shuffle=BlockShuffle(spec.shuffle_block, spec.shuffle_window), seed=spec.seed, epoch=epoch)
    keys = [s.key for p in local for s in scan_tar(p)]
    return [keys[i] for i in samples.tolist()]


def test_an_http_epoch_follows_the_block_order_from_the_spec(local: list[str], tmp_path: Path) -> None:
    spec = {**SMALL_SPEC, "shuffle": {"buffer": 64, "shards": True, "block": 6, "window": 2}}
    with RangeServer(Path(local[0]).parent) as srv:
        urls = [f"{srv.url}/{Path(p).name}" for p in local]
        loader = feedfast.DataLoader(spec, shards=urls, shuffle=True, backend="dali", num_workers=1,
                                     cache_dir=tmp_path)
        assert loader._partition == "block" and loader.shards.shuffle == BlockShuffle(6, 2)
        first, second = keys_of_epoch(loader), keys_of_epoch(loader)
        state = loader.state_dict()
        loader.close()
        other = feedfast.DataLoader(spec, shards=urls, shuffle=True, backend="dali", num_workers=1, rank=0,
                                    world_size=2, cache_dir=tmp_path)
        with pytest.raises(UserError, match="world size"):  # a block-shuffled state resumes the same world size only
            other.load_state_dict(state)
        other.close()
    assert first == _block_keys(loader, local, 0) and second == _block_keys(loader, local, 1)
    assert first != second and Counter(first) == Counter(second) and len(set(first)) == 23
    # pipe: shards are cached whole and read from the cache in the same order
    piped = feedfast.DataLoader(spec, shards=[f"pipe:cat {p}" for p in local], shuffle=True, backend="dali",
                                num_workers=1, cache_dir=tmp_path / "pipe")
    assert piped.shards.kinds == ("cache",) * 5 and piped._partition == "block"
    assert keys_of_epoch(piped) == first
    piped.close()


class _GcsStandIn:
    """fsspec's local filesystem under the gs scheme: ``gs://bucket/key`` is ``<root>/bucket/key``."""

    @staticmethod
    def install(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        import importlib

        from fsspec.implementations.local import LocalFileSystem

        class GcsStandIn(LocalFileSystem):
            protocol = ("gs", "gcs")

            @classmethod
            def _strip_protocol(cls, path: Any) -> Any:
                path = str(path)
                return str(root / path[len("gs://"):]) if path.startswith("gs://") else super()._strip_protocol(path)

        monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, "gs", GcsStandIn)


@pytest.fixture()
def gs(local: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The shards as ``gs://bucket/...`` through the stand-in; yields the brace pattern."""
    (tmp_path / "gcs" / "bucket").mkdir(parents=True)
    for p in local:
        (tmp_path / "gcs" / "bucket" / Path(p).name).write_bytes(Path(p).read_bytes())
    _GcsStandIn.install(tmp_path / "gcs", monkeypatch)
    yield "gs://bucket/train-{0000..0004}.tar"


def test_gs_shards_through_the_transport_block_shuffled_and_under_skip(local: list[str], gs: str,
                                                                      tmp_path: Path) -> None:
    spec = {**SMALL_SPEC, "shuffle": {"buffer": 64, "shards": True, "block": 8, "window": 2}}
    loader = feedfast.DataLoader(spec, shards=gs, shuffle=True, backend="dali", num_workers=1,
                                 cache_dir=tmp_path / "c1", remote_retries=0)
    assert loader.shards.kinds == ("gs",) * 5
    assert keys_of_epoch(loader) == _block_keys(loader, local, 0)  # ranges read through fsspec, in the block order
    loader.close()
    loader = feedfast.DataLoader(SMALL_SPEC, shards=gs, shuffle=False, backend="dali", num_workers=1,
                                 on_error="skip", cache_dir=tmp_path / "c2")
    assert loader.shards.kinds == ("cache",) * 5  # downloaded whole through the gs transport, checked locally
    assert keys_of_epoch(loader) == [s.key for p in local for s in scan_tar(p)]
    loader.close()


def test_a_stretch_of_rows_equals_the_whole_epoch_sorted_at_once() -> None:
    """BlockOrder sorts only the places around the rows asked for: the same order as sorting every key."""
    from feedfast.order.block import BlockOrder
    from feedfast.order.permute import mix64

    order = BlockOrder([1000] * 30, rank=1, world=3, shuffle=BlockShuffle(512, 16), seed=0, epoch=2)
    places = np.arange(order.count)
    run = np.searchsorted(order.run_start, places, side="right") - 1
    u = (mix64(places.astype(np.uint64) ^ order.key) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    by_key = np.argsort(places + order.low[run] + u * (order.high[run] - order.low[run]), kind="stable")
    whole = order.run_first[run[by_key]] + by_key - order.run_start[run[by_key]]
    assert np.array_equal(order(places), whole)
    picked = np.random.default_rng(0).integers(0, order.count, 500)
    assert np.array_equal(order(picked), whole[picked])
    for w in order.window_of(whole[:50]).tolist():  # each window's members: its samples in this rank
        assert set(order.members(w).tolist()) == set(whole[order.window_of(whole) == w].tolist())


def test_a_threaded_http_epoch_reads_each_shard_in_few_requests_and_every_sample_once(
        local: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from feedfast.sources import windows as windows_module
    spec = {**SMALL_SPEC, "shuffle": {"buffer": 64, "shards": True, "block": 64, "window": 1}}  # a window a sample

    def epoch_requests(widen: bool) -> tuple[int, list[str]]:
        if not widen:
            monkeypatch.setattr(windows_module.WindowCache, "_widen", lambda self, group, size, groups, later: None)
        with RangeServer(Path(local[0]).parent) as srv:
            loader = feedfast.DataLoader(spec, shards=[f"{srv.url}/{Path(p).name}" for p in local], shuffle=True,
                                         backend="threads", num_workers=2, cache_dir=tmp_path / str(widen))
            assert loader._partition == "block"
            opened = len(srv.requests)
            keys = keys_of_epoch(loader)
            loader.close()
            ranged = [r for r in srv.requests[opened:] if r[0] == "GET" and r[2]]
        monkeypatch.undo()
        return len(ranged), keys

    widened, keys = epoch_requests(True)
    apart, same = epoch_requests(False)
    assert len(set(keys)) == 23 and same == keys  # widening changes the requests, never the samples or their order
    # 5 shards: a request each an epoch (10 seen: the next epoch starts after the last batch), against a window each
    assert widened <= 3 * len(local) < apart
