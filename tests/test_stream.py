"""The stream transport's windowed shuffle and its window cache."""

from __future__ import annotations

import random
import threading
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from feedfast.sources.feeder import WindowCache
from feedfast.sources.stream import window_shuffle


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


def test_window_cache_reads_each_window_once_and_bounds_memory() -> None:
    window = np.array([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4)
    calls: list[list[int]] = []
    lock = threading.Lock()

    def fetch(rows: list[int]) -> dict[tuple[int, int], np.ndarray]:
        with lock:
            calls.append(rows)
        return {(r, 0): np.array([r], dtype=np.uint8) for r in rows}

    cache = WindowCache(window, fetch, keep=2)
    threads = [threading.Thread(target=cache.rows, args=([0, 1, 5],)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = cache.rows([2, 6])
    assert got[2, 0][0] == 2 and got[6, 0][0] == 6
    assert Counter(tuple(c) for c in calls) == Counter({(0, 1, 2, 3): 1, (4, 5, 6, 7): 1})
    cache.rows([8, 12])  # windows 2 and 3 push 0 and 1 out
    cache.rows([0])
    assert Counter(tuple(c) for c in calls)[(0, 1, 2, 3)] == 2
