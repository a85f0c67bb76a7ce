"""The stream transport's batch feeder: its window cache."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np

from feedfast.sources.feeder import WindowCache


def test_window_cache_reads_each_window_once_and_drops_it_after_its_last_step() -> None:
    window = np.array([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4)
    calls: list[list[int]] = []
    lock = threading.Lock()

    def fetch(rows: list[int]) -> dict[tuple[int, int], np.ndarray]:
        with lock:
            calls.append(rows)
        return {(r, 0): np.array([r], dtype=np.uint8) for r in rows}

    cache = WindowCache(window, fetch, last_step={0: 1, 1: 1, 2: 3, 3: 3})
    try:
        threads = [threading.Thread(target=cache.rows, args=([0, 1, 5, 9],)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = cache.rows([2, 6])
        assert got[2, 0][0] == 2 and got[6, 0][0] == 6
        # four threads asked at once: each window read once, the three a step lacked concurrently
        assert Counter(tuple(c) for c in calls) == Counter({(0, 1, 2, 3): 1, (4, 5, 6, 7): 1, (8, 9, 10, 11): 1})
        assert cache.held() == 3
        cache.release(0)  # no window ends at step 0
        assert cache.held() == 3
        cache.release(1)  # windows 0 and 1 are read by no later step
        assert cache.held() == 1
        cache.rows([0])  # asked again (a step read twice): read again
        assert Counter(tuple(c) for c in calls)[(0, 1, 2, 3)] == 2
    finally:
        cache.close()
    assert cache.held() == 0


def test_a_failed_window_read_fails_its_step_and_is_tried_again() -> None:
    window = np.array([0, 0, 1, 1])
    fail = [True]

    def fetch(rows: list[int]) -> dict[tuple[int, int], np.ndarray]:
        if rows == [2, 3] and fail:
            fail.pop()
            raise OSError("connection reset")
        return {(r, 0): np.array([r], dtype=np.uint8) for r in rows}

    cache = WindowCache(window, fetch, last_step={0: 0, 1: 0})
    try:
        try:
            cache.rows([0, 2])
            raise AssertionError("the failed read was not raised")
        except OSError as exc:
            assert "connection reset" in str(exc)
        assert cache.rows([3])[3, 0][0] == 3  # not cached as failed: read again
    finally:
        cache.close()
