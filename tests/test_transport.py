"""The transport layer against a broken server: the registry of schemes, deadlines, byte bounds, short bodies.

Every fault is the loopback range server's (:mod:`tests.rangeserver`); no test reaches the
network, and the deadlines are fractions of a second.
"""

from __future__ import annotations

import os
import re
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Iterator

import pytest

import feedfast
from feedfast.errors import ShardError, UserError
from feedfast.loader.backends.dali import rescue
from feedfast.shards.index.tarindex import left_out
from feedfast.shards.transport import objectstore, schemes
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import RemoteError, Transfer, fetch_range, http_stream, http_validators
from feedfast.shards.transport.transport import transport_for
from feedfast.sources import dataset, shardlist
from tests.rangeserver import RangeServer

QUICK = Transfer(timeout=2.0, retries=1, backoff=0.01, deadline=0.3, min_rate=1 << 20)
DATA = os.urandom(200_000)


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[RangeServer]:
    (tmp_path / "a.bin").write_bytes(DATA)
    with RangeServer(tmp_path) as srv:
        yield srv


def _url(srv: RangeServer) -> str:
    return f"{srv.url}/a.bin"


# -- the registry --------------------------------------------------------------------------------------------


def test_every_kind_question_is_answered_by_the_registry() -> None:
    assert shardlist.REMOTE_PREFIXES == ("http://", "https://", "s3://", "gs://", "pipe:")
    assert set(rescue.RESCUABLE_KINDS) == {"file", "http", "s3", "gs", "cache"}  # what has byte ranges
    for name, kind in schemes.KINDS.items():
        assert schemes.kind(name) is kind
        for prefix in kind.prefixes:
            url = f"{prefix}x/a.tar"
            assert schemes.url_kind(url) == name
            transport = transport_for(url)
            assert transport.kind is kind and transport.ranged == kind.ranged
    assert ShardCache("/nonexistent").kind is schemes.CACHE
    assert schemes.url_kind("data/a.tar") == schemes.url_kind("/abs/a.tar") == "file"


@pytest.mark.parametrize("url", ["hdfs://nn/a.tar", "ftp://h/a.tar", "s3a://b/a.tar", "HTTP2://h/a.tar"])
def test_an_unknown_scheme_is_a_user_error_naming_it_and_the_supported_ones(url: str, small_spec: dict) -> None:
    scheme = url.split("://")[0]
    with pytest.raises(UserError, match=rf"unsupported shard URL.*scheme '{scheme}'.*http://, https://, s3://"):
        schemes.url_kind(url)
    with pytest.raises(ShardError, match=rf"scheme '{scheme}'"):
        transport_for(url)
    with pytest.raises(ShardError, match=rf"scheme '{scheme}'.*pipe:CMD"):  # refused before DALI ever sees it
        feedfast.DataLoader(small_spec, shards=[url])
    with pytest.raises(ShardError, match="unknown shard kind 'ftp'"):
        schemes.kind("ftp")


# -- deadlines ----------------------------------------------------------------------------------------------


def test_a_trickling_server_fails_a_ranged_read_at_its_deadline(server: RangeServer) -> None:
    """The deadline holds the whole fetch, retries included: a try cut at it is not retried (issue 37 item 13)."""
    server.faults["/a.bin"] = ["trickle"]  # a byte every 50 ms: every socket read is in time
    start = time.monotonic()
    with pytest.raises(RemoteError, match=r"a\.bin' at bytes 100-2099 after 1 tries: TimeoutError.*deadline.*no time "
                                          r"left to retry within the fetch's deadline, retries included"):
        fetch_range(_url(server), 100, 2000, QUICK)  # 100 s at that rate
    assert time.monotonic() - start < 2.5
    assert fetch_range(_url(server), 100, 2000, QUICK) == DATA[100:2100]  # recovered: read again


def test_a_trickling_server_fails_a_whole_download_and_nothing_is_cached(server: RangeServer,
                                                                         tmp_path: Path) -> None:
    server.faults["/a.bin"] = ["trickle"]  # one try: the deadline holds the fetch, retries included
    cache = ShardCache(str(tmp_path / "cache"), transfer=QUICK)
    start = time.monotonic()
    with pytest.raises(RemoteError, match="TimeoutError.*deadline"):
        cache.ensure(_url(server))
    assert time.monotonic() - start < 2.5
    assert not list((tmp_path / "cache").glob("*.tar")) and not list((tmp_path / "cache").glob(".*part"))
    assert cache.ensure(_url(server)).read_bytes() == DATA


def test_a_long_download_is_given_time_for_its_bytes() -> None:
    slow = Transfer(deadline=1.0, min_rate=1000)
    assert slow.budget(0) == 1.0 and slow.budget(5000) == 6.0


# -- byte bounds --------------------------------------------------------------------------------------------


def test_a_206_larger_than_the_range_is_read_only_for_the_bytes_asked(server: RangeServer) -> None:
    server.faults["/a.bin"] = ["oversize"]  # 300 MB from the offset asked, whatever range was asked
    tracemalloc.start()
    try:
        start = time.monotonic()
        assert fetch_range(_url(server), 1000, 16, QUICK) == DATA[1000:1016]
        took = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20 and took < 1.0, (peak, took)
    time.sleep(0.05)
    assert server.sent < 16 << 20  # the connection was dropped, not read to the end
    assert fetch_range(_url(server), 1000, 16, QUICK) == DATA[1000:1016]  # and the next request is answered


def test_a_server_that_ignores_range_is_read_only_up_to_the_range(server: RangeServer) -> None:
    server.faults["/a.bin"] = ["full"]
    assert fetch_range(_url(server), 300, 10, QUICK) == DATA[300:310]


def test_a_range_past_the_end_names_the_shard_size_at_once(server: RangeServer) -> None:
    with pytest.raises(RemoteError, match=r"truncated: .*a\.bin' has 200000 bytes.*before byte 200006"):
        fetch_range(_url(server), len(DATA) - 10, 16, Transfer(retries=3, backoff=5.0))  # not retried


# -- short bodies -------------------------------------------------------------------------------------------


def test_a_dropped_range_is_retried_and_then_named_with_its_offset(server: RangeServer) -> None:
    server.faults["/a.bin"] = ["drop"]
    assert fetch_range(_url(server), 100, 5000, QUICK) == DATA[100:5100]
    server.faults["/a.bin"] = ["drop"] * 2
    with pytest.raises(RemoteError, match=r"a\.bin' at bytes 100-5099 after 2 tries: ShortBody.*2500 of its 5000"):
        fetch_range(_url(server), 100, 5000, QUICK)


def test_a_dropped_download_is_retried_never_cached_short_and_whole_once_the_server_recovers(
        server: RangeServer, tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), transfer=QUICK)
    server.faults["/a.bin"] = ["drop"]  # once: the retry reads it whole
    assert cache.ensure(_url(server)).read_bytes() == DATA
    url = f"{server.url}/b.bin"
    (Path(server.root) / "b.bin").write_bytes(DATA)
    server.faults["/b.bin"] = ["drop:65536"] * 2  # every try: Python's read(n) gives 64 KiB and no error
    with pytest.raises(RemoteError, match=r"b\.bin' after 2 tries: ShortBody.*65536 of its 200000"):
        cache.ensure(url)
    assert not cache.path_for(url).exists()
    assert cache.ensure(url).read_bytes() == DATA  # a later run, the server recovered: the whole shard


def test_a_dropped_stream_is_an_error_for_any_reader(server: RangeServer) -> None:
    server.faults["/a.bin"] = ["drop"] * 2
    with pytest.raises(RemoteError, match="ShortBody"):
        http_stream(_url(server), lambda f: b"".join(iter(lambda: f.read(4096), b"")), QUICK)
    assert http_validators(_url(server), QUICK)["content-length"] == str(len(DATA))


# -- pipe: commands have http's deadline ------------------------------------------------------------------------

PIPE_DEADLINE = Transfer(retries=0, deadline=1.0, min_rate=1 << 20)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (exited, or a zombie no one has reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _ends(pid: int) -> bool:
    """Whether process ``pid`` ends within a second (SIGKILL is sent; its end is seen at once or within ms)."""
    for _ in range(100):
        if _gone(pid):
            return True
        time.sleep(0.01)
    return _gone(pid)


def test_a_hanging_pipe_command_is_killed_with_its_children_at_the_deadline_and_nothing_is_cached(
        tmp_path: Path) -> None:
    url = f"pipe:sleep 60 & echo $! > {tmp_path / 'child'}; printf abc; wait"  # writes a little, then hangs
    cache = ShardCache(str(tmp_path / "cache"), transfer=PIPE_DEADLINE)
    start = time.monotonic()
    with pytest.raises(RemoteError, match=rf"{re.escape(repr(url))}.*deadline of 1 s.*3 bytes.*group was killed"):
        cache.ensure(url)
    assert time.monotonic() - start < 2.5
    child = int((tmp_path / "child").read_text())
    assert _ends(child), "the command's child outlived its deadline"
    assert not list((tmp_path / "cache").glob("*.tar")) and not list((tmp_path / "cache").glob(".*part"))


def test_a_pipe_commands_descendant_that_left_its_group_is_killed_too(tmp_path: Path) -> None:
    url = f"pipe:setsid sleep 60 & echo $! > {tmp_path / 'child'}; printf abc; wait"  # a session of its own
    start = time.monotonic()
    with pytest.raises(RemoteError, match="deadline of 1 s.*group was killed"):
        transport_for(url, PIPE_DEADLINE).stream(url, lambda f: f.read())
    assert time.monotonic() - start < 2.5
    child = int((tmp_path / "child").read_text())
    assert _ends(child), "the command's setsid child outlived its deadline"


def test_a_pipe_command_that_closes_stdout_and_hangs_is_killed_at_the_deadline(tmp_path: Path) -> None:
    url = "pipe:printf abc; exec >&-; sleep 60"
    start = time.monotonic()
    with pytest.raises(RemoteError, match="deadline of 1 s"):
        transport_for(url, PIPE_DEADLINE).stream(url, lambda f: f.read())
    assert time.monotonic() - start < 2.5


def test_a_pipe_command_within_its_deadline_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(DATA)
    url = f"pipe:sleep 0.3; cat {tmp_path / 'a.bin'}"
    assert transport_for(url, PIPE_DEADLINE).stream(url, lambda f: f.read()) == DATA


def test_a_pipe_command_past_its_deadline_is_named_under_raise_and_counted_under_skip(tmp_path: Path) -> None:
    url = "pipe:sleep 60"
    cache = ShardCache(str(tmp_path / "shards"), transfer=PIPE_DEADLINE)
    with pytest.raises(RemoteError, match=r"'pipe:sleep 60'.*deadline"):
        dataset.locate(url, tmp_path, cache, check_locally=False)
    found = dataset.locate(url, tmp_path, cache, check_locally=True)  # on_error: skip
    [(key, reason)] = left_out(found.index)
    assert found.samples == [] and key == "?" and re.search(r"'pipe:sleep 60'.*deadline.*cannot be fetched", reason)


# -- fsspec reads: the same deadline on each call, a late call abandoned ------------------------------------------


class _StuckFile:
    """An fsspec file whose reads wait until ``release`` is set (a server that never answers), then answer."""

    size = 10

    def __init__(self, release: threading.Event) -> None:
        self.release, self.closed, self.reading, self.at = release, False, False, 0

    def read(self, n: int) -> bytes:
        self.reading = True
        self.release.wait()
        assert not self.closed, "closed under a read"
        self.reading = False
        data = b"x" * max(0, min(n, self.size - self.at))
        self.at += len(data)
        return data

    def close(self) -> None:
        assert not self.reading, "closed under a read"
        self.closed = True


class _StuckFS:
    """An fsspec filesystem whose calls hang until ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.files: list[_StuckFile] = []

    def open(self, path: str, mode: str) -> _StuckFile:
        self.files.append(_StuckFile(self.release))
        return self.files[-1]

    def cat_file(self, path: str, start: int, end: int) -> bytes:
        self.release.wait()
        return b"x" * (end - start)

    def info(self, path: str) -> dict[str, object]:
        self.release.wait()
        return {"size": 10}


def test_a_stuck_fsspec_read_fails_at_the_deadline_and_the_abandoned_call_closes_its_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fs = _StuckFS()
    monkeypatch.setattr(objectstore, "_filesystem", lambda url: (fs, url))
    gs = transport_for("gs://bucket/a.tar", Transfer(retries=0, deadline=0.5, min_rate=1 << 20))
    for name, read in (("read_range", lambda: gs.read_range("gs://bucket/a.tar", 0, 10)),
                       ("stream", lambda: gs.stream("gs://bucket/a.tar", lambda f: f.read())),
                       ("validators", lambda: gs.validators("gs://bucket/a.tar"))):
        start = time.monotonic()
        late = r"'gs://bucket/a\.tar'.*TimeoutError.*deadline \(0\.[45]\d* s were left.*abandoned"
        with pytest.raises(RemoteError, match=late):
            read()
        assert time.monotonic() - start < 1.5, name
    [stuck] = fs.files
    assert not stuck.closed  # the abandoned read still holds it
    fs.release.set()
    for _ in range(100):
        if stuck.closed:
            break
        time.sleep(0.01)
    assert stuck.closed  # closed by the abandoned read once it returned, never under it
    assert gs.stream("gs://bucket/a.tar", lambda f: f.read()) == b"x" * 10 and fs.files[-1].closed
