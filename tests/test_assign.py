"""Shard order, rank ranges and per-rank epoch plans: worked examples and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedfast.order.deal import plan_epoch, rank_range, shard_order

POLICIES = ("partial", "pad", "drop")


def plans(sizes: list[int], *, batch_size: int, world: int, last_batch: str, **kw: object) -> list:
    return [plan_epoch(sizes, batch_size=batch_size, rank=r, world=world, last_batch=last_batch, **kw)
            for r in range(world)]


@pytest.mark.parametrize(("policy", "batch_sizes", "valid", "padded", "dropped"), [
    ("partial", (2, 2, 2, 1), (2, 2, 2, 1), 0, 0),
    ("pad", (2, 2, 2, 2), (2, 2, 2, 1), 1, 0),
    ("drop", (2, 2, 2), (2, 2, 2), 0, 1),
])
def test_docstring_seven_samples_one_rank(policy: str, batch_sizes: tuple, valid: tuple, padded: int,
                                          dropped: int) -> None:
    (p,) = plans([7], batch_size=2, world=1, last_batch=policy)
    assert (p.batch_sizes, p.valid, p.padded, p.dropped) == (batch_sizes, valid, padded, dropped)
    assert p.steps == len(batch_sizes) and p.rank_samples == 7


def test_docstring_nine_samples_two_ranks_partial() -> None:
    r0, r1 = plans([4, 5], batch_size=2, world=2, last_batch="partial")
    assert (r0.rank_samples, r1.rank_samples) == (4, 5)
    assert r0.batch_sizes == r1.batch_sizes == (2, 2, 1)
    assert r0.valid == (2, 2, 0) and r0.padded == 1
    assert r1.valid == (2, 2, 1) and r1.padded == 0


def test_shards_split_across_ranks_regardless_of_boundaries() -> None:
    assert [rank_range(10, r, 3) for r in range(3)] == [(0, 3), (3, 6), (6, 10)]
    assert [rank_range(2, r, 4) for r in range(4)] == [(0, 0), (0, 1), (1, 1), (1, 2)]


sizes_st = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(sizes=sizes_st, batch=st.integers(1, 9), world=st.integers(1, 6), policy=st.sampled_from(POLICIES),
       seed=st.integers(0, 2**16), epoch=st.integers(0, 50), shuffle=st.booleans())
def test_plan_properties(sizes: list[int], batch: int, world: int, policy: str, seed: int, epoch: int,
                         shuffle: bool) -> None:
    total = sum(sizes)
    ps = plans(sizes, batch_size=batch, world=world, last_batch=policy, seed=seed, epoch=epoch,
               shuffle_shards=shuffle)
    assert len({p.steps for p in ps}) == 1, "DDP needs the same number of steps on every rank"
    assert len({p.batch_sizes for p in ps}) == 1, "batch j has the same size on every rank"
    assert len({p.shard_order for p in ps}) == 1
    assert sum(p.rank_samples for p in ps) == total
    for p in ps:
        assert len(p.batch_sizes) == len(p.valid) == p.steps
        assert all(0 <= v <= b for v, b in zip(p.valid, p.batch_sizes))
        assert all(1 <= b <= batch for b in p.batch_sizes)
        # padding only at the end: once a batch is short of real samples, later ones are empty
        short = [j for j, (v, b) in enumerate(zip(p.valid, p.batch_sizes)) if v < b]
        assert all(p.valid[j] == 0 for j in short[1:])
        assert p.padded >= 0 and p.dropped >= 0
    if policy == "drop":
        counts = [p.rank_samples for p in ps]
        assert ps[0].steps == min(counts) // batch
        for p in ps:
            assert p.padded == 0 and all(v == b == batch for v, b in zip(p.valid, p.batch_sizes))
            assert p.dropped == p.rank_samples - p.steps * batch
    else:
        assert sum(sum(p.valid) for p in ps) == total
        assert all(p.dropped == 0 for p in ps)
        if policy == "pad":
            assert all(b == batch for p in ps for b in p.batch_sizes)
        else:  # partial: the biggest rank pads nothing
            assert min(p.padded for p in ps) == 0


@settings(max_examples=300, deadline=None)
@given(total=st.integers(0, 500), world=st.integers(1, 16))
def test_rank_range_partitions_exactly(total: int, world: int) -> None:
    ranges = [rank_range(total, r, world) for r in range(world)]
    covered = [i for a, b in ranges for i in range(a, b)]
    assert covered == list(range(total))
    lengths = [b - a for a, b in ranges]
    assert max(lengths) - min(lengths) <= 1


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 60), seed=st.integers(0, 2**31), epoch=st.integers(0, 1000), shuffle=st.booleans())
def test_shard_order_is_a_deterministic_permutation(n: int, seed: int, epoch: int, shuffle: bool) -> None:
    order = shard_order(n, seed=seed, epoch=epoch, shuffle=shuffle)
    assert sorted(order) == list(range(n))
    assert order == shard_order(n, seed=seed, epoch=epoch, shuffle=shuffle)
    if not shuffle:
        assert order == tuple(range(n))


@settings(max_examples=100, deadline=None, derandomize=True)  # a chance property: fixed examples
@given(n=st.integers(4, 60), seed=st.integers(0, 2**31), first=st.integers(0, 1000))
def test_shard_order_changes_across_epochs(n: int, seed: int, first: int) -> None:
    orders = {shard_order(n, seed=seed, epoch=e, shuffle=True) for e in range(first, first + 5)}
    assert len(orders) >= 3  # n >= 4 has 24+ orders; five epochs rarely collide twice


def test_shard_order_depends_on_seed() -> None:
    assert len({shard_order(10, seed=s, epoch=0, shuffle=True) for s in range(5)}) == 5


@given(total=st.integers(1, 400), batch=st.integers(1, 20), world=st.integers(1, 6),
       last=st.sampled_from(["partial", "pad", "drop"]), partition=st.sampled_from(["shards", "global"]))
@settings(max_examples=300, deadline=None)
def test_per_step_sizes_are_runs_equal_to_the_formula(total: int, batch: int, world: int, last: str,
                                                      partition: str) -> None:
    """The plan keeps per-step sizes as runs (O(1) whatever the steps); they are the per-step formula's values."""
    from feedfast.order.deal import rank_counts

    if total < world or (last == "drop" and total // world < batch):
        return
    counts = (rank_counts(total, world=world, batch_size=batch) if partition == "global" else
              [b - a for a, b in (rank_range(total, r, world) for r in range(world))])
    for rank in range(world):
        ep = plan_epoch([total], batch_size=batch, rank=rank, world=world, last_batch=last, partition=partition)
        mine, biggest = counts[rank], max(counts)
        steps = min(counts) // batch if last == "drop" else -(-biggest // batch)
        valid = [batch] * steps if last == "drop" else [max(0, min(batch, mine - j * batch)) for j in range(steps)]
        sizes = [batch] * steps if last in ("drop", "pad") else [max(1, min(batch, biggest - j * batch))
                                                                  for j in range(steps)]
        assert list(ep.valid) == valid and list(ep.batch_sizes) == sizes and ep.steps == steps
        assert ep.valid == tuple(valid) and [ep.batch_sizes[j] for j in range(steps)] == sizes
        assert ep.padded == sum(sizes) - sum(valid) and len(ep.batch_sizes.runs) <= 3
