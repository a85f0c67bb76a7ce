"""A rank's samples of an epoch: rows as functions of the epoch's order, and the windowed shuffle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedfast.order.deal import plan_epoch, rank_positions, rank_range
from feedfast.order.globalorder import epoch_order
from feedfast.order.orders import epoch_rows
from feedfast.order.permute import key_for
from feedfast.order.shardrange import RangeOrder, WindowShuffle
from feedfast.shards.index.tarindex import load_index
from feedfast.sources.dataset import ShardSet
from tests.helpers import make_shards


def _window_shuffle(n: int, window: int, seed: int, lo: int = 0) -> tuple[list[int], list[int]]:
    """A WindowShuffle of ``range(lo, lo + n)`` as arrays: the samples read at each row, and their windows."""
    shuffled = WindowShuffle(RangeOrder([lo + n], [0], lo), n, window, key_for("t", seed))
    samples = shuffled(np.arange(n, dtype=np.int64))
    return samples.tolist(), shuffled.window_of(samples).tolist()


@given(n=st.integers(0, 500), window=st.integers(1, 64), seed=st.integers(0, 10), lo=st.integers(0, 7))
@settings(max_examples=150, deadline=None)
def test_window_shuffle_is_a_permutation_that_stays_inside_windows(n: int, window: int, seed: int, lo: int) -> None:
    perm, win = _window_shuffle(n, window, seed, lo)
    assert sorted(perm) == list(range(lo, lo + n)) and len(win) == n
    for item, w in zip(perm, win):
        assert (item - lo) // window == w  # each item sits in its own window
    # windows are visited whole, one after another
    runs = [w for i, w in enumerate(win) if i == 0 or win[i - 1] != w]
    assert len(runs) == len(set(runs))


def test_window_shuffle_rows_are_the_same_read_alone_or_together() -> None:
    shuffled = WindowShuffle(RangeOrder([1000], [0], 0), 1000, 7, key_for("t", 3))
    whole = shuffled(np.arange(1000))
    picked = np.random.default_rng(0).integers(0, 1000, 300)
    assert np.array_equal(shuffled(picked), whole[picked])
    for w in (0, 5, 142):
        assert sorted(shuffled.members(w).tolist()) == list(range(7 * w, min(1000, 7 * w + 7)))


def test_window_shuffle_is_deterministic_and_mixes() -> None:
    a = _window_shuffle(100, 10, 0)
    assert a == _window_shuffle(100, 10, 0)
    assert a != _window_shuffle(100, 10, 1)
    assert a[0] != list(range(100))


EXTS = [{"jpg"}, {"cls"}]


@pytest.fixture(scope="module")
def sset(tmp_path_factory: pytest.TempPathFactory) -> ShardSet:
    root = tmp_path_factory.mktemp("rows")
    shards = make_shards(root, samples=23, per_shard=5)
    idx = tuple(str(load_index(p, root)[0]) for p in shards)
    return ShardSet(tuple(shards), idx, (5, 5, 5, 5, 3), cache_dir=str(root / "cache"))


@pytest.mark.parametrize(("world", "batch", "consumed"), [(1, 4, 0), (2, 3, 0), (3, 2, 7), (4, 5, 4)])
def test_global_rows_are_the_permutation_dealt_in_global_batches(sset: ShardSet, world: int, batch: int,
                                                                 consumed: int) -> None:
    order = epoch_order(23, seed=3, epoch=1, shuffle=True)[consumed:]
    seen = []
    for rank in range(world):
        ep = plan_epoch(list(sset.sizes), batch_size=batch, rank=rank, world=world, last_batch="partial",
                        partition="global", consumed=consumed)
        rows = epoch_rows(sset, EXTS, ep, rank=rank, world=world, seed=3, epoch=1, shuffle=True)
        assert len(rows) == ep.rank_samples
        got = rows.samples(np.arange(len(rows)))
        assert got.tolist() == order[rank_positions(23 - consumed, rank=rank, world=world, batch_size=batch)].tolist()
        seen += got.tolist()
    assert sorted(seen) == sorted(order.tolist())  # every sample once, after those consumed


def test_unshuffled_rows_are_the_ranks_range_and_shuffled_a_permutation_of_it(sset: ShardSet) -> None:
    for rank in range(2):
        ep = plan_epoch(list(sset.sizes), batch_size=4, rank=rank, world=2, last_batch="partial")
        lo, hi = rank_range(23, rank, 2)
        plain = epoch_rows(sset, EXTS, ep, rank=rank, world=2, seed=0, epoch=0, shuffle=False)
        assert plain.samples(np.arange(len(plain))).tolist() == list(range(lo, hi))
        mixed = epoch_rows(sset, EXTS, ep, rank=rank, world=2, seed=0, epoch=0, shuffle=True)
        got = mixed.samples(np.arange(len(mixed))).tolist()
        assert sorted(got) == list(range(lo, hi)) and got != list(range(lo, hi))
        assert mixed.keys([0]) == plain.keys([got[0] - lo])


def test_a_range_over_shards_in_another_order_maps_back_to_canonical_numbers() -> None:
    sizes, order = [5, 5, 5, 5, 3], [3, 0, 4, 1, 2]
    concatenated = [n for s in order for n in range(sum(sizes[:s]), sum(sizes[:s]) + sizes[s])]
    assert RangeOrder(sizes, order, 4)(np.arange(15)).tolist() == concatenated[4:19]


def test_rows_far_apart_and_in_any_order_agree_with_the_chunked_ones(sset: ShardSet) -> None:
    ep = plan_epoch(list(sset.sizes), batch_size=4, rank=0, world=1, last_batch="partial", partition="global")
    rows = epoch_rows(sset, EXTS, ep, rank=0, world=1, seed=9, epoch=0, shuffle=True)
    whole = rows.samples(np.arange(23))
    assert rows.samples([22, 0, 5]).tolist() == whole[[22, 0, 5]].tolist()
    where = rows.take([1, 2])
    assert where.samples.tolist() == whole[[1, 2]].tolist() and where.shard.tolist() == (whole[[1, 2]] // 5).tolist()
