"""Remote shards on the CPU paths (``sources/rangeread.py``): over a loopback ranged http server, the threaded
and ``pil`` backends deliver what local shards give them, bit for bit, in every order; resume mid-epoch and
elastically; damage is an error naming the shard and sample (or, under ``on_error: skip``, counted when the
dataset is opened); the reads run ahead of decoding, bounded. s3 (moto) is in ``tests/test_s3.py``."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import feedfast
from feedfast.errors import ShardError, UserError
from feedfast.loader.backends.cpu import batchplan, native
from feedfast.loader.backends.cpu.pil import run_pil_epoch
from feedfast.loader.backends.cpu.threads import run_thread_epoch
from feedfast.shards.index.tarindex import format_index, scan_tar
from feedfast.shards.transport.remote import RemoteError, Transfer
from feedfast.sources import members, rangeread
from feedfast.sources.rangeread import AHEAD, PART, StepReads
from tests.helpers import make_shards
from tests.rangeserver import RangeServer

Batches = list[tuple[list[str], list[int], torch.Tensor]]


def _epoch(loader: feedfast.DataLoader, stop: int | None = None) -> Batches:
    out = []
    for images, labels in loader:
        out.append(([k for _, k in loader.last_origins[: loader.last_valid]], labels.tolist(), images.clone()))
        if stop is not None and len(out) == stop:
            break
    return out


def _same(a: Batches, b: Batches) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[1] == y[1] and torch.equal(x[2], y[2]) for x, y in zip(a, b))


def _loader(spec: dict, shards: Any, **kw: Any) -> feedfast.DataLoader:
    kw.setdefault("num_workers", 2)
    return feedfast.DataLoader(spec, shards=shards, **kw)


def _local_in_order_of(here: feedfast.DataLoader, there: feedfast.DataLoader, epoch: int,
                       run: Any = run_thread_epoch) -> Batches:
    """The epoch ``there`` (remote shards) reads, read by ``run`` (the threaded path; or the pil backend's) from
    ``here``'s local shards with ``pread``: the same rows (an order depends on the shards' sizes only), the same plan."""
    shards = dataclasses.replace(here.shards, shuffle=there.shards.shuffle)
    out = []
    for batch in run(here.plan, shards, there.epoch_plan(epoch), rank=0, world=1, batch_size=4, workers=0
                     if run is run_pil_epoch else 2, seed=here.spec.seed, epoch=epoch):
        images, labels = batch.fields["image"], batch.fields["label"]
        out.append(([k for _, k in list(batch.origins)[: batch.valid]], labels.tolist(), images.clone()))
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_auto_runs_the_threaded_path_over_http_and_delivers_what_local_shards_do(
        small_spec: dict, local: list[str], server: RangeServer, shuffle: bool) -> None:
    here, there = _loader(small_spec, local, shuffle=shuffle), _loader(small_spec, server.urls(local), shuffle=shuffle)
    assert (here.backend, there.backend) == ("threads", "threads")
    assert there.shards.kinds == ("http",) * 5
    assert there._partition == ("block" if shuffle else "shards")  # windows, a request each (schemes.HTTP)
    for epoch in (0, 1):
        there.set_epoch(epoch)
        got = _epoch(there)
        assert _same(got, _local_in_order_of(here, there, epoch))  # the same samples, labels, pixels, batch for batch
        assert sorted(k for keys, _, _ in got for k in keys) == sorted(f"train-{i:08d}" for i in range(23))
    here.close()
    there.close()
    ranged = [r for r in server.requests if r[0] == "GET" and r[2]]
    assert ranged and all(r[2].startswith("bytes=") for r in ranged)  # read by range, never whole


def test_the_pil_backend_reads_http_shards_by_range_too(small_spec: dict, local: list[str],
                                                        server: RangeServer) -> None:
    for workers in (0, 2):  # in this process, and in DataLoader worker processes (each makes its own reader)
        here = _loader(small_spec, local, shuffle=True, backend="pil", num_workers=workers)
        there = _loader(small_spec, server.urls(local), shuffle=True, backend="pil", num_workers=workers)
        assert there._partition == "block"
        assert _same(_epoch(there), _local_in_order_of(here, there, 0, run_pil_epoch)) if workers == 0 else \
            [b[:2] for b in _epoch(there)] == [b[:2] for b in _epoch(_loader(small_spec, server.urls(local),
                                                                              shuffle=True))]
        here.close()
        there.close()


def test_remote_samples_take_the_planned_one_call_path_from_memory(small_spec: dict, local: list[str],
                                                                   server: RangeServer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if batchplan.ext is None or not batchplan.one_call():
        pytest.skip("the planned one-call path does not run here (extension or resampler flavour)")
    made = []
    original = native.ext.sample_batch

    def counted(images: list[Any], *args: Any) -> Any:
        made.append(sum(isinstance(i, memoryview) for i in images))  # slices of the request, not copies
        return original(images, *args)

    def no_pread(*args: Any) -> Any:
        raise AssertionError("a remote sample was read with pread")

    monkeypatch.setattr(native.ext, "sample_batch", counted)
    monkeypatch.setattr(members, "read_members", no_pread)
    loader = _loader(small_spec, server.urls(local), shuffle=True)
    assert sum(len(keys) for keys, _, _ in _epoch(loader)) == 23
    loader.close()
    # every sample's bytes, from memory and not copied, into sample_batch (and the next epoch's first, made ahead)
    assert sum(made) >= 23


def test_resume_mid_epoch_over_http_on_the_threaded_path(small_spec: dict, local: list[str],
                                                         server: RangeServer) -> None:
    urls = server.urls(local)
    full = _loader(small_spec, urls, shuffle=True)
    expected = _epoch(full) + _epoch(full)
    full.close()
    part = _loader(small_spec, urls, shuffle=True)
    assert part.backend == "threads"
    taken = _epoch(part, stop=3)
    state = json.loads(json.dumps(part.state_dict()))
    part.close()
    resumed = _loader(small_spec, urls, shuffle=True)
    resumed.load_state_dict(state)
    assert _same(taken + _epoch(resumed) + _epoch(resumed), expected)  # the rest of epoch 0, then epoch 1
    resumed.close()


def test_a_state_over_downloaded_http_shards_resumes_at_another_world_size(small_spec: dict, local: list[str],
                                                                           server: RangeServer,
                                                                           tmp_path: Path) -> None:
    """Under on_error: skip, http shards are downloaded, checked and read from the shard cache in the global order:
    a state taken at 1 rank resumes at 2, each remaining sample once, in order. Read in place (the block shuffle),
    a state resumes the same world size only, and another is refused naming what differs."""
    urls, kw = server.urls(local), dict(shuffle=True, batch_size=2, on_error="skip", cache_dir=tmp_path)
    whole = _loader(small_spec, urls, **kw)
    assert whole.shards.kinds == ("cache",) * 5 and whole._partition == "global"
    sequence = [k for keys, _, _ in _epoch(whole) for k in keys]
    whole.close()
    first = _loader(small_spec, urls, **kw)
    head = [k for keys, _, _ in _epoch(first, stop=3) for k in keys]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    ranks = [_loader(small_spec, urls, rank=r, world_size=2, **kw) for r in (0, 1)]
    for loader in ranks:
        loader.load_state_dict(state)
    steps = [_epoch(loader) for loader in ranks]
    for loader in ranks:
        loader.close()
    tail = [k for s in range(max(map(len, steps))) for rank in steps if s < len(rank) for k in rank[s][0]]
    assert head + tail == sequence  # step by step, rank by rank: the rest of the one global order
    assert Counter(head + tail) == Counter(f"train-{i:08d}" for i in range(23))
    in_place = _loader(small_spec, urls, shuffle=True, batch_size=2)
    _epoch(in_place, stop=2)
    block_state = json.loads(json.dumps(in_place.state_dict()))
    in_place.close()
    other = _loader(small_spec, urls, shuffle=True, batch_size=2, rank=0, world_size=2)
    with pytest.raises(UserError, match="cannot resume from this state"):
        other.load_state_dict(block_state)
    other.close()


def test_a_short_body_is_retried_and_a_persistent_one_names_the_shard_and_sample(
        small_spec: dict, local: list[str], server: RangeServer) -> None:
    urls = server.urls(local)
    expected = _epoch(_loader(small_spec, local))
    loader = _loader(small_spec, urls, remote_retries=2)
    server.faults["/train-0002.tar"] = ["drop"]  # once: retried
    assert _same(_epoch(loader), expected)
    loader.close()  # its next epoch, started while this one drained, may have read shard 2 already
    server.faults["/train-0002.tar"] = ["drop"] * 100
    loader = _loader(small_spec, urls, remote_retries=2)
    with pytest.raises(RemoteError, match=r"cannot read sample 'train-000000(1[0-4])' of shard "
                                          rf"'{urls[2]}'.*after 3 tries: ShortBody") as caught:
        _epoch(loader)
    assert caught.value.url == urls[2]
    loader.close()


def test_a_shard_cut_or_gone_after_opening_names_the_shard_and_sample(small_spec: dict, local: list[str],
                                                                     tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    for p in local[:2]:
        shutil.copy(p, served)
    with RangeServer(served) as srv:
        urls = [f"{srv.url}/{os.path.basename(p)}" for p in local[:2]]
        loader = _loader(small_spec, urls, remote_retries=0, cache_dir=tmp_path / "c")
        assert loader.backend == "threads"
        data = (served / "train-0001.tar").read_bytes()
        (served / "train-0001.tar").write_bytes(data[: len(data) // 3])  # cut on the server, after the index
        with pytest.raises(RemoteError, match=rf"cannot read sample 'train-0000000[5-9]' of shard '{urls[1]}'"):
            _epoch(loader)
        (served / "train-0001.tar").unlink()
        with pytest.raises(RemoteError, match=rf"cannot read sample 'train-0000000[5-9]' of shard '{urls[1]}'.*404"):
            _epoch(loader)
        loader.close()


def test_a_stale_sidecar_index_is_an_error_naming_the_sample_never_a_mislabel(small_spec: dict,
                                                                            tmp_path: Path) -> None:
    (big,) = make_shards(tmp_path / "local", samples=240, per_shard=240)  # about 1 MB
    samples = scan_tar(big)
    middle = [i for i, s in enumerate(samples) if 400_000 < s.members[0].offset < 600_000]
    labels = {i: next(m for m in samples[i + 1].members if m.ext == "cls") for i in middle[:-1]}
    shifted = [dataclasses.replace(s, members=tuple(
        dataclasses.replace(m, offset=labels[i].offset) if m.ext == "cls" and i in labels else m for m in s.members))
        for i, s in enumerate(samples)]  # mid-shard labels point at the next sample's: the ends are right
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(big, served)
    (served / "train-0000.idx").write_text(format_index(shifted), encoding="utf-8")
    with RangeServer(served) as srv:  # the first and last 256 KiB are right: trusted when opened
        url = f"{srv.url}/train-0000.tar"
        loader = _loader(small_spec, url, cache_dir=tmp_path / "c", shuffle=True)
        assert loader.backend == "threads" and loader._partition == "block"
        with pytest.raises(ShardError, match=rf"cannot read sample '(train-\d+)' of shard '{url}'.*"
                                             r"does not match the tar: sample '\1' has a member.*another sample") as caught:
            for _ in loader:
                pass
        assert caught.value.args[0].split("'")[1] in {samples[i].key for i in labels}
        loader.close()


def test_a_trickling_server_times_out_naming_the_shard_and_sample(small_spec: dict, local: list[str],
                                                                  server: RangeServer) -> None:
    loader = _loader(small_spec, server.urls(local))
    shards = dataclasses.replace(loader.shards, transfer=Transfer(timeout=2.0, retries=0, deadline=0.3,
                                                                  min_rate=1e12))
    server.trickle_every = 0.05
    server.faults["/train-0000.tar"] = ["trickle"] * 100
    started = time.monotonic()
    with pytest.raises(RemoteError, match=rf"cannot read sample 'train-0000000[0-4]' of shard "
                                          rf"'{server.urls(local)[0]}'"):
        list(run_thread_epoch(loader.plan, shards, loader.epoch_plan(0), rank=0, world=1, batch_size=4, workers=2,
                              seed=0, epoch=0))
    assert time.monotonic() - started < 10
    loader.close()


def test_http_under_on_error_skip_reads_the_checked_downloads_in_the_global_order(
        small_spec: dict, local: list[str], server: RangeServer, tmp_path: Path) -> None:
    loader = _loader(small_spec, server.urls(local), shuffle=True, on_error="skip", cache_dir=tmp_path)
    assert loader.backend == "threads" and loader.shards.kinds == ("cache",) * 5 and loader._partition == "global"
    assert _same(_epoch(loader), _epoch(_loader(small_spec, local, shuffle=True, on_error="skip")))
    loader.close()


class _Recorded:
    """A stand-in row source for :class:`StepReads`: records the rows it reads and on which thread."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.read_rows: list[list[int]] = []
        self.wanted: list[list[int]] = []
        self.threads: set[str] = set()
        self.gate = gate
        self.closed = False

    def want(self, rows: list[int]) -> None:
        self.wanted.append(list(rows))

    def read(self, rows: list[int]) -> list[list[bytes | None]]:
        if self.gate is not None:
            self.gate.wait(5)
        self.read_rows.append(list(rows))
        self.threads.add(threading.current_thread().name)
        return [[str(r).encode() for r in rows], [None for _ in rows]]

    def close(self) -> None:
        self.closed = True


def test_reads_run_ahead_on_their_own_threads_and_are_bounded() -> None:
    source = _Recorded()
    steps = 10
    reads = StepReads(source, lambda s: list(range(s * 40, s * 40 + 40)), steps=steps)  # type: ignore[arg-type]
    reads.want(0)
    assert reads.held() == AHEAD + 1  # the step asked for and AHEAD more
    assert source.wanted == [list(range(0, 40 * (AHEAD + 1)))]  # their windows asked for at once, before the parts
    got = reads.chunk(0, 5, 37)  # spans three parts
    assert got[0] == [str(r).encode() for r in range(5, 37)] and got[1] == [None] * 32
    assert reads.chunk(2, 0, 1)[0] == [b"80"]  # read ahead already
    reads.release(1)
    assert reads.held() == AHEAD + 1 - 2
    reads.want(steps - 1)
    assert reads.held() <= AHEAD + 1 + 1  # never past the epoch's end
    reads.close()
    assert source.closed and all(name.startswith("feedfast-range") for name in source.threads)
    parts = sorted(tuple(r) for r in source.read_rows)
    assert all(len(p) <= PART for p in parts)


def test_a_failed_read_reaches_the_chunk_that_needs_it() -> None:
    class Failing(_Recorded):
        def read(self, rows: list[int]) -> list[list[bytes | None]]:
            raise RemoteError("cannot read sample 'k' of shard 'http://x/a.tar': HTTP 500", url="http://x/a.tar")

    reads = StepReads(Failing(), lambda s: [0, 1, 2], steps=1)  # type: ignore[arg-type]
    with pytest.raises(RemoteError, match="sample 'k'"):
        reads.chunk(0, 0, 3)
    reads.close()


def test_which_kinds_are_read_here() -> None:
    assert not rangeread.remote(("file", "file"))
    assert rangeread.remote(("file", "http")) and rangeread.remote(("cache",))
    assert rangeread.unranged(("http", "s3", "cache")) is None and rangeread.unranged(("pipe",)) == "pipe"


def test_a_chunk_whose_bytes_are_not_read_yet_is_counted_as_a_wait(caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()
    reads = StepReads(_Recorded(gate), lambda s: [0, 1, 2], steps=2)  # type: ignore[arg-type]
    reads.want(0)
    threading.Timer(0.2, gate.set).start()
    assert reads.chunk(0, 0, 3)[0] == [b"0", b"1", b"2"]  # waited for the gate
    deadline = time.monotonic() + 10
    while not reads._parts[1][0].done() and time.monotonic() < deadline:  # step 1's read, queued with step 0
        time.sleep(0.01)
    assert reads.chunk(1, 0, 3)[0] == [b"0", b"1", b"2"]  # read ahead meanwhile: no wait
    assert (reads.chunks, reads.waits) == (2, 1) and reads.waited >= 0.1
    with caplog.at_level("DEBUG", logger="feedfast.rangeread"):
        reads.close()
    assert "decoding waited on 1 of 2 chunks" in caplog.text


def test_the_readers_and_window_requests_grow_with_the_decoding_threads(
        small_spec: dict, local: list[str], server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from feedfast.sources import rangeread
    from feedfast.sources import windows as windows_module
    seen: list[tuple[str, int]] = []
    steps, windows = rangeread.StepReads.__init__, windows_module.WindowCache.__init__

    def step_reads(self: Any, *args: Any, readers: int = rangeread.READERS, **kw: Any) -> None:
        seen.append(("readers", readers))
        steps(self, *args, readers=readers, **kw)

    def window_cache(self: Any, *args: Any, requests: int = 8, **kw: Any) -> None:
        seen.append(("requests", requests))
        windows(self, *args, requests=requests, **kw)

    monkeypatch.setattr(rangeread.StepReads, "__init__", step_reads)
    monkeypatch.setattr(windows_module.WindowCache, "__init__", window_cache)
    for workers, expect in ((2, 8), (12, 24)):
        seen.clear()
        loader = feedfast.DataLoader(small_spec, shards=server.urls(local), backend="threads", num_workers=workers,
                                     cache_dir=tmp_path)
        assert sum(loader.last_valid for _ in loader) == 23
        loader.close()
        assert set(seen) == {("readers", expect), ("requests", expect)}, workers
    assert rangeread.readers_for(48) == rangeread.READERS_MAX == 64  # each reader holds a connection
