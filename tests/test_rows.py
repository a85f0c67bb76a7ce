"""A rank's samples: the windowed shuffle."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from feedfast.sources.rows import window_shuffle


@given(n=st.integers(0, 500), window=st.integers(1, 64), seed=st.integers(0, 10))
@settings(max_examples=150, deadline=None)
def test_window_shuffle_is_a_permutation_that_stays_inside_windows(n: int, window: int, seed: int) -> None:
    perm, win = window_shuffle(n, window, random.Random(seed))
    assert sorted(perm) == list(range(n)) and len(win) == n
    for item, w in zip(perm, win):
        assert item // window == w  # each item sits in its own window
    # windows are visited whole, one after another
    runs = [w for i, w in enumerate(win) if i == 0 or win[i - 1] != w]
    assert len(runs) == len(set(runs))


def test_window_shuffle_is_deterministic_and_mixes() -> None:
    a = window_shuffle(100, 10, random.Random("s/0/0"))
    assert a == window_shuffle(100, 10, random.Random("s/0/0"))
    assert a != window_shuffle(100, 10, random.Random("s/1/0"))
    assert a[0] != list(range(100))
