"""The stream transport's batch feeder: its window cache."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np

from feedfast.sources.feeder import WindowCache


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
