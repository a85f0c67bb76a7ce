"""Under on_error: skip, a shard unreadable mid-epoch: its rows lost and named, its batches made whole."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from feedfast.errors import ShardError
from feedfast.loader.backends.dali.feed import BatchFeeder, Filled
from feedfast.order.deal import plan_epoch, step_positions
from feedfast.order.orders import epoch_rows
from feedfast.shards.index.tarindex import format_index, scan_tar
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import Transfer
from feedfast.sources.dataset import ShardSet
from feedfast.sources.lostrows import LostShards, lost_last
from tests.helpers import make_shards


def test_a_failed_read_is_read_again_shard_by_shard_and_a_dead_shard_is_not_asked_for_again(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[list[int]] = []

    def read(rows: list[int]) -> list[list[object]]:  # rows 0-3 in shard 0, 4-7 in shard 1, which fails
        calls.append(rows)
        if any(r >= 4 for r in rows):
            raise ShardError("shard 1 is gone")
        return [[f"m{r}" for r in rows]]

    lost = LostShards(("a.tar", "b.tar"), lambda rows: [r // 4 for r in rows], 1)
    with caplog.at_level(logging.WARNING, logger="feedfast.lostrows"):
        assert lost.read([3, 4, 0], read) == [["m3", None, "m0"]]
        assert lost.read([5, 1], read) == [[None, "m1"]]  # shard 1 dead: only shard 0's row is read
    assert calls == [[3, 4, 0], [3, 0], [4], [1]]
    assert lost.lost == {4: "its shard could not be read mid-epoch: shard 1 is gone", 5: lost.lost[4]}
    assert lost.live([0, 4, 7, 2]) == [0, 2]
    assert caplog.text.count("shard 'b.tar' cannot be read") == 1  # one warning for the epoch


def test_lost_rows_go_after_the_batch_samples_and_before_its_padding() -> None:
    assert lost_last(6, 4, {1, 3}) == ([0, 2, 1, 3, 4, 5], 0, 2)
    assert lost_last(4, 2, {0, 1}) == ([0, 1, 2, 3], 2, 0)  # no sample left: a padding row that was read fills
    assert lost_last(3, 3, {0, 1, 2}) == ([0, 1, 2], None, 0)  # nothing read: the caller finds a sample


def _feeder(tmp_path: Path, commands: list[str]) -> BatchFeeder:
    """An unshuffled epoch of 2 cached ``pipe:`` shards of 4 samples, steps of 4, under skip."""
    shards = make_shards(tmp_path / "shards", samples=8, per_shard=4)
    indexes = []
    for i, shard in enumerate(shards):
        indexes.append(tmp_path / f"{i}.idx")
        indexes[-1].write_text(format_index(scan_tar(shard)))
    urls = tuple(cmd.format(shard=shard) for cmd, shard in zip(commands, shards))
    cache = ShardCache(str(tmp_path / "cache"))
    sset = ShardSet(urls, tuple(map(str, indexes)), (4, 4), kinds=("cache", "cache"), cache=cache,
                    cache_dir=str(tmp_path))
    ep = plan_epoch([4, 4], batch_size=4, rank=0, world=1, last_batch="partial", partition="shards")
    rows = epoch_rows(sset, [{"jpg"}, {"cls"}], ep, rank=0, world=1, seed=0, epoch=0, shuffle=False)
    return BatchFeeder(urls, ("cache", "cache"), rows, lambda s: step_positions(s, 4, 8), steps=2, cache=cache,
                       transfer=Transfer(retries=0), workers=1, ahead=0, valid=ep.valid)


def test_a_step_all_of_whose_rows_are_lost_is_fed_copies_of_a_sample_of_a_shard_that_can_be_read(
        tmp_path: Path) -> None:
    feeder = _feeder(tmp_path, ["pipe:cat {shard}", "pipe:false"])
    try:
        lost = feeder.batch(1)  # shard 1's step, asked for first: no sample read yet
        first = feeder.batch(0)
        assert [bytes(m) for m in lost[0]] == [bytes(first[0][0])] * 4  # shard 0's first sample
        assert feeder.filled == {1: Filled([0, 1, 2, 3], 0, (4, 5, 6, 7))} and 0 not in feeder.filled
        assert feeder.lost is not None and sorted(feeder.lost.lost) == [4, 5, 6, 7]
        assert "shard command failed (exit 1)" in feeder.lost.lost[4]
    finally:
        feeder.close()


def test_an_epoch_none_of_whose_shards_can_be_read_is_an_error_saying_so(tmp_path: Path) -> None:
    feeder = _feeder(tmp_path, ["pipe:false", "pipe:exit 3"])
    try:
        with pytest.raises(ShardError, match=r"no shard of this rank's epoch can be read.*2 shards lost mid-epoch"):
            feeder.batch(0)
    finally:
        feeder.close()
