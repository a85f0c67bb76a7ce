"""The stream transport's batch feeder: its window cache, and the check of a non-local shard's index as it is read."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from feedfast.errors import ShardError
from feedfast.loader.backends.dali.feed import BatchFeeder
from feedfast.order.deal import plan_epoch, step_positions
from feedfast.order.orders import epoch_rows
from feedfast.shards.index.tarindex import format_index, scan_tar
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import Transfer
from feedfast.sources import windows as windows_module
from feedfast.sources.dataset import ShardSet
from feedfast.sources.windows import WindowCache
from tests.helpers import make_shards


class _Windows:
    """Windows of 4 consecutive samples (the Windows protocol of feedfast.loader.backends.dali.feed)."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def window_of(self, samples: np.ndarray) -> np.ndarray:
        return np.asarray(samples) // 4

    def members(self, window: int) -> np.ndarray:
        return np.arange(4 * window, min(self.samples, 4 * window + 4))


def test_window_cache_reads_each_window_once_and_drops_it_once_each_sample_is_served() -> None:
    calls: list[list[int]] = []
    lock = threading.Lock()

    def fetch(samples: list[int]) -> dict[tuple[int, int], np.ndarray]:
        with lock:
            calls.append(samples)
        return {(s, 0): np.array([s], dtype=np.uint8) for s in samples}

    cache = WindowCache(_Windows(16), fetch)
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
        cache.rows([3, 4, 7])  # window 0's last sample, and window 1's last two: both done
        assert cache.held() == 1
        cache.rows([0])  # asked again (a step read twice, a padded repeat): read again
        assert Counter(tuple(c) for c in calls)[(0, 1, 2, 3)] == 2
    finally:
        cache.close()
    assert cache.held() == 0


def test_a_failed_window_read_fails_its_step_and_is_tried_again() -> None:
    fail = [True]

    def fetch(samples: list[int]) -> dict[tuple[int, int], np.ndarray]:
        if samples == [4, 5, 6, 7] and fail:
            fail.pop()
            raise OSError("connection reset")
        return {(s, 0): np.array([s], dtype=np.uint8) for s in samples}

    cache = WindowCache(_Windows(8), fetch)
    try:
        try:
            cache.rows([0, 4])
            raise AssertionError("the failed read was not raised")
        except OSError as exc:
            assert "connection reset" in str(exc)
        assert cache.rows([5])[5, 0][0] == 5  # not cached as failed: read again
    finally:
        cache.close()


def test_windows_wanted_at_once_that_follow_each_other_are_one_read_up_to_the_merge_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[int]] = []
    fail = [True]

    def fetch(samples: list[int]) -> dict[tuple[int, int], np.ndarray]:
        calls.append(samples)
        if 24 in samples and fail:
            fail.pop()
            raise OSError("connection reset")
        return {(s, 0): np.array([s], dtype=np.uint8) for s in samples}

    monkeypatch.setattr(windows_module, "MERGE_BYTES", 12)  # three windows of 4 one-byte samples a read
    cache = WindowCache(_Windows(32), fetch, nbytes=len)
    try:
        cache.want([0, 5, 9, 13, 17, 29])  # windows 0 to 4 (one read of three, one of two) and 7 alone
        got = cache.rows([1, 2, 17, 30])  # read already: nothing more is fetched
        assert [got[s, 0][0] for s in (1, 2, 17, 30)] == [1, 2, 17, 30]
        assert sorted(map(tuple, calls)) == [tuple(range(0, 12)), tuple(range(12, 20)), tuple(range(28, 32))]
        calls.clear()
        with pytest.raises(OSError, match="connection reset"):
            cache.rows([21, 25])  # windows 5 and 6: one read, failed for both
        assert calls == [list(range(20, 28))]
        assert cache.rows([26])[26, 0][0] == 26  # neither is kept as failed: read again
    finally:
        cache.close()


class _Placed(_Windows):
    """Windows of 4 samples, 16 samples a shard, window ``w`` read around row ``spacing * w`` over ``horizon`` rows
    (as the block shuffle's)."""

    def __init__(self, samples: int, spacing: int, horizon: int) -> None:
        super().__init__(samples)
        self.spacing, self.horizon = spacing, horizon

    def place(self, window: int) -> int:
        return self.spacing * window if 4 * window < self.samples else -1


def _placed_cache(calls: list[list[int]], samples: int, *, spacing: int, horizon: int) -> WindowCache:
    """A window cache over :class:`_Placed` windows (one-byte samples, 16 a shard) that records each fetch."""
    def fetch(samples: list[int]) -> dict[tuple[int, int], np.ndarray]:
        calls.append(samples)
        return {(s, 0): np.array([s], dtype=np.uint8) for s in samples}

    return WindowCache(_Placed(samples, spacing, horizon), fetch, nbytes=len, shard_of=lambda s: s // 16)


def test_a_read_is_widened_to_its_shards_next_windows_within_the_bytes_and_never_across_shards(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[int]] = []
    monkeypatch.setattr(windows_module, "MERGE_BYTES", 12)
    cache = _placed_cache(calls, 32, spacing=0, horizon=100)
    try:
        cache.rows([0])  # window 0, widened to 1 and 2: 12 bytes
        cache.rows([13])  # window 3, the shard's last: not widened into shard 1's window 4
        assert sorted(cache.rows([1, 5, 9, 14])._windows) == [0, 1, 2, 3]
        assert sorted(map(tuple, calls)) == [tuple(range(0, 12)), tuple(range(12, 16))]
        assert cache.held() == 4
    finally:
        cache.close()


def test_two_reads_of_a_shard_asked_for_at_once_become_one_across_the_gap_between_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[int]] = []
    monkeypatch.setattr(windows_module, "MERGE_BYTES", 64)
    cache = _placed_cache(calls, 32, spacing=0, horizon=100)
    try:
        cache.rows([1, 13, 17])  # windows 0 and 3 of shard 0 (1 and 2 between, not asked for), window 4 of shard 1
        assert sorted(map(tuple, calls)) == [tuple(range(0, 16)), tuple(range(16, 32))]
    finally:
        cache.close()


def test_a_read_is_widened_only_to_windows_read_within_the_horizon_and_never_to_one_served_already(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[int]] = []
    monkeypatch.setattr(windows_module, "MERGE_BYTES", 64)
    cache = _placed_cache(calls, 16, spacing=100, horizon=150)
    try:
        cache.rows([8])  # window 2 (row 200): windows 1 and 3 are within 150 rows, window 0 (row 0) is not
        assert sorted(calls[0]) == list(range(4, 16))
        cache.rows([0, 1, 2, 3])  # window 0 alone, then served whole: dropped
        assert calls[1] == [0, 1, 2, 3] and cache.held() == 3
        cache.rows(list(range(4, 16)))  # the others served: nothing is held
        assert cache.held() == 0
        calls.clear()
        cache.rows([5])  # a padded repeat asks for window 1 again: read again, alone (its neighbours were served)
        assert calls == [[4, 5, 6, 7]]
    finally:
        cache.close()


def test_a_cached_shard_read_through_a_wrong_index_is_an_error_naming_the_sample(tmp_path: Path) -> None:
    (shard,) = make_shards(tmp_path / "shards", samples=8, per_shard=8)
    samples = scan_tar(shard)
    cache = ShardCache(str(tmp_path / "cache"))
    url = "pipe:cat the-shard"
    Path(cache.path_for(url)).parent.mkdir(parents=True)
    Path(cache.path_for(url)).write_bytes(Path(shard).read_bytes())  # as if downloaded
    for swapped, expect in ((False, None), (True, samples[4].key)):
        wrong = list(samples)
        if swapped:  # sample 4's label read from sample 5's offset
            label = samples[5].members[1]
            wrong[4] = dataclasses.replace(samples[4], members=(samples[4].members[0],
                                                                dataclasses.replace(wrong[4].members[1],
                                                                                    offset=label.offset)))
        index = tmp_path / f"index-{swapped}.idx"
        index.write_text(format_index(wrong))
        sset = ShardSet((url,), (str(index),), (8,), kinds=("cache",), cache=cache, cache_dir=str(tmp_path))
        ep = plan_epoch([8], batch_size=4, rank=0, world=1, last_batch="partial", partition="shards")
        rows = epoch_rows(sset, [{"jpg"}, {"cls"}], ep, rank=0, world=1, seed=0, epoch=0, shuffle=False)
        feeder = BatchFeeder((url,), ("cache",), rows, lambda s: step_positions(s, 4, 8), steps=2, cache=cache,
                             transfer=Transfer(), workers=1, ahead=0)
        try:
            assert len(feeder.batch(0)[1]) == 4  # samples 0-3: right either way
            if expect is None:
                assert [bytes(a) for a in feeder.batch(1)[1]] == [
                    Path(shard).read_bytes()[m.offset:m.offset + m.size] for m in (s.members[1] for s in samples[4:])]
            else:
                with pytest.raises(ShardError, match=rf"sample '{expect}' has a member at offset "
                                                     rf"{samples[5].members[1].offset}.*another sample"):
                    feeder.batch(1)
        finally:
            feeder.close()
