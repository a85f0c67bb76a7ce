"""DALI's feed on local shards: a step's members handed to DALI as views of the shards mapped (no read, no copy),
or read in one call per component into a reused ring; the components only host ops read kept out of DALI; labels
parsed a batch at a time."""

from __future__ import annotations

import re
from collections import deque
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from feedfast.errors import ShardError
from feedfast.loader.backends.dali.feed import DALI_HOLDS, BatchFeeder, StepBytes
from feedfast.ops.generic import DecodeFailure, _label_host
from feedfast.order.deal import plan_epoch, step_positions
from feedfast.order.orders import epoch_rows
from feedfast.shards.index.tarindex import load_index
from feedfast.shards.transport.remote import Transfer
from feedfast.sources.dataset import ShardSet
from tests.helpers import make_shards

_plan = pytest.importorskip("feedfast._plan", reason="feedfast._plan is not built: the feed reads per sample")
BATCH = 4


def _feed(tmp_path: Path, shards: list[str], **kw: object) -> BatchFeeder:
    idx = tuple(str(load_index(p, tmp_path)[0]) for p in shards)
    sizes = [len(load_index(p, tmp_path)[1]) for p in shards]
    sset = ShardSet(tuple(shards), idx, tuple(sizes), cache_dir=str(tmp_path))
    ep = plan_epoch(sizes, batch_size=BATCH, rank=0, world=1, last_batch="partial", partition="global", epoch=1)
    rows = epoch_rows(sset, [{"jpg"}, {"cls"}], ep, rank=0, world=1, seed=0, epoch=1, shuffle=True)
    return BatchFeeder(tuple(shards), ("file",) * len(shards), rows,
                       partial(step_positions, batch_size=BATCH, count=len(rows)), steps=ep.steps, cache=None,
                       transfer=Transfer(), workers=2, ahead=2, **kw)  # type: ignore[arg-type]


def _members(feed: BatchFeeder, step: int, component: int) -> list[bytes]:
    """The step's members of ``component``, read from the tars with plain file reads."""
    where = feed.rows.take(feed.step_rows(step))
    out = []
    for shard, offset, size in zip(where.shard.tolist(), where.offsets[:, component].tolist(),
                                   where.sizes[:, component].tolist()):
        with open(feed.names[shard], "rb") as f:
            f.seek(offset)
            out.append(f.read(size))
    return out


def test_the_packed_feed_hands_dali_each_member_and_keeps_the_labels_out_of_it(tmp_path: Path) -> None:
    shards = make_shards(tmp_path, samples=22, per_shard=5)
    feed = _feed(tmp_path, shards, dali=[0])
    try:
        assert feed.packed and feed.ring is not None
        held = deque(maxlen=DALI_HOLDS)  # DALI holds its last few steps' TensorLists while later ones are read
        for step in range(feed.steps):
            (images,) = feed(step)  # one TensorList: the images; the label component is not DALI's
            held.append((step, images))
            labels = feed.host(step, 1)
            assert isinstance(labels, StepBytes)
            assert [bytes(v) for v in labels.views()] == _members(feed, step, 1)
            for s, tl in held:  # the ring wrote no buffer DALI still holds
                assert [np.asarray(tl[i]).tobytes() for i in range(len(tl))] == _members(feed, s, 0)
    finally:
        feed.close()


def test_the_packed_path_reads_what_the_member_reader_reads(tmp_path: Path) -> None:
    shards = make_shards(tmp_path, samples=13, per_shard=4)
    feed = _feed(tmp_path, shards)
    try:
        for step in range(feed.steps):
            packed = [[bytes(v) for v in part.views()] for part in feed.step_bytes(step)]
            by_reader = [[bytes(a) for a in column] for column in feed.reader.members(feed.step_rows(step))]
            assert packed == by_reader
    finally:
        feed.close()


def test_dali_is_handed_views_of_the_shards_mapped_not_copies(tmp_path: Path) -> None:
    shards = make_shards(tmp_path, samples=12, per_shard=4)
    feed = _feed(tmp_path, shards, dali=[0])
    try:
        for step in range(feed.steps):
            (images,) = feed(step)
            where = feed.rows.take(feed.step_rows(step))
            for i, (shard, offset) in enumerate(zip(where.shard.tolist(), where.offsets[:, 0].tolist())):
                mapped = feed.members.files.mapped(shard)  # type: ignore[union-attr]
                base = np.frombuffer(mapped, dtype=np.uint8).ctypes.data
                assert images[i].data_ptr() == base + offset  # the shard's own bytes, where the index says
    finally:
        feed.close()


def test_shards_past_the_maps_allowed_are_read_into_the_ring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from feedfast.shards.transport import shardfiles

    monkeypatch.setattr(shardfiles, "MAX_MAPS", 1)  # one shard mapped: every step touching another is read
    shards = make_shards(tmp_path, samples=12, per_shard=3)
    feed = _feed(tmp_path, shards, dali=[0])
    try:
        for step in range(feed.steps):
            (images,) = feed(step)
            assert [np.asarray(images[i]).tobytes() for i in range(len(images))] == _members(feed, step, 0)
        assert len([m for m in feed.members.files._maps.values() if m is not None]) == 1  # type: ignore[union-attr]
    finally:
        feed.close()


def test_a_shard_cut_before_dali_asks_is_an_error_naming_the_shard_and_sample(tmp_path: Path) -> None:
    shards = make_shards(tmp_path, samples=8, per_shard=4)
    feed = _feed(tmp_path, shards, dali=[0])
    with open(shards[1], "r+b") as f:
        f.truncate(1024)  # mapped at its length now: members past it are refused, never touched (no SIGBUS)
    try:
        with pytest.raises(ShardError, match=re.escape(shards[1]) + r".*truncated|sample .* of shard"):
            for step in range(feed.steps):
                feed(step)
    finally:
        feed.close()


def test_a_shard_cut_short_is_an_error_naming_the_shard_and_sample(tmp_path: Path) -> None:
    shards = make_shards(tmp_path, samples=8, per_shard=4)
    feed = _feed(tmp_path, shards)
    with open(shards[1], "r+b") as f:
        f.truncate(1024)  # past its index's first member: every later member is gone
    try:
        with pytest.raises(ShardError, match=re.escape(shards[1]) + r".*truncated|sample .* of shard"):
            for step in range(feed.steps):
                feed.step_bytes(step)
    finally:
        feed.close()


LABELS = [b"0", b"42", b" 7\n", b"\t+13\r\n", b"-3", b"0007", b"00000000000000000000000001", b"9223372036854775807",
          b"-9223372036854775808", b"9223372036854775808", b"", b" ", b"4_2", b"42.0", b"0x2a", b"1 2", b"+",
          b"\x00", b"\xef\xbb\xbf1", b"12345678901234567890", "\u0663".encode()]


@pytest.mark.parametrize("offset", [0, 1, -5])
def test_a_batch_of_labels_parses_as_the_label_op_parses_each(offset: int) -> None:
    for label in LABELS:
        data = np.frombuffer(b"xx" + label + b"yy", dtype=np.uint8)
        out = np.zeros(1, dtype=np.int64)
        bad = _plan.parse_labels(data, np.array([2], dtype=np.int64), np.array([len(label)], dtype=np.int64),
                                 offset, out)
        try:
            want = _label_host(label, {"offset": offset}, None)  # type: ignore[arg-type]
        except DecodeFailure:
            assert bad == 0, label
        else:
            assert bad == -1 and int(out[0]) == want, label
