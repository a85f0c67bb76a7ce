"""The epoch order as a function: a keyed bijection of range(n), its uniformity and its cost in memory."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedfast.order.permute import Permutation, key_for


@given(n=st.integers(0, 3000), seed=st.integers(0, 50))
@settings(max_examples=120, deadline=None)
def test_it_is_a_bijection_of_the_range(n: int, seed: int) -> None:
    out = Permutation(n, key_for("t", seed))(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))


def test_the_key_fixes_it_and_any_part_changes_it() -> None:
    a = Permutation(1000, key_for("order", 1, 0))(np.arange(1000))
    assert np.array_equal(a, Permutation(1000, key_for("order", 1, 0))(np.arange(1000)))
    assert not np.array_equal(a, Permutation(1000, key_for("order", 1, 1))(np.arange(1000)))
    assert not np.array_equal(a, Permutation(1000, key_for("order", 2, 0))(np.arange(1000)))


def test_any_slice_of_positions_gives_the_slice_of_the_whole() -> None:
    p = Permutation(100_003, key_for("slices", 0))
    whole = p(np.arange(100_003))
    assert np.array_equal(p(np.arange(5_000, 5_256)), whole[5_000:5_256])
    assert np.array_equal(p(np.array([100_002, 0, 7])), whole[[100_002, 0, 7]])


def test_a_hundred_million_costs_no_memory_of_its_own() -> None:
    p = Permutation(100_000_000, key_for("big", 0))
    out = p(np.arange(99_999_000, 100_000_000))
    assert len(set(out.tolist())) == 1000 and out.min() >= 0 and out.max() < 100_000_000


def test_it_looks_uniform() -> None:
    """Each position lands in each tenth of the range about equally often, and neighbours are unrelated."""
    n, trials = 1000, 400
    where = np.zeros((10, 10))
    for seed in range(trials):
        out = Permutation(n, key_for("uniform", seed))(np.arange(0, n, 100))
        where[np.arange(10), out // 100] += 1
    expected = trials / 10
    chi2 = float(((where - expected) ** 2 / expected).sum())
    assert chi2 < 160, chi2  # 90 degrees of freedom: p < 1e-5 beyond 160
    o = Permutation(200_000, key_for("corr", 0))(np.arange(200_000)).astype(float)
    assert abs(np.corrcoef(o[:-1], o[1:])[0, 1]) < 0.01
    assert abs(np.corrcoef(np.arange(200_000), o)[0, 1]) < 0.01


def test_positions_outside_the_range_are_refused() -> None:
    with pytest.raises(IndexError):
        Permutation(10, key_for("x"))(np.array([10]))
