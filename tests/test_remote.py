"""Remote shards: http(s) and pipe: deliver what local shards do, retries, errors, the shard cache, resume."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import re
import shutil
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import feedfast
from feedfast.errors import ShardError
from feedfast.shards.index.remote import remote_index
from feedfast.shards.index.tarindex import format_index, scan_tar
from feedfast.shards.transport import cache as cache_module
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import RemoteError, Transfer, fetch_range, http_stream, http_validators
from feedfast.shards.transport.transport import transport_for
from feedfast.sources.shardlist import resolve_shards
from tests.helpers import make_shards
from tests.rangeserver import RangeServer

FAST = Transfer(timeout=5.0, retries=3, backoff=0.01)


Batches = list[tuple[list[str], list[int], torch.Tensor]]


def _epoch(loader: feedfast.DataLoader) -> Batches:
    """One epoch as (real keys, labels, images) per batch."""
    out = []
    for images, labels in loader:
        out.append(([k for _, k in loader.last_origins[: loader.last_valid]], labels.tolist(), images.clone()))
    return out


def _run(spec: dict, shards: Any, epochs: int = 1, **kw: Any) -> Batches:
    kw.setdefault("num_workers", 2)
    kw.setdefault("backend", "dali")  # local and remote runs through the same backend
    loader = feedfast.DataLoader(spec, shards=shards, **kw)
    out = [b for _ in range(epochs) for b in _epoch(loader)]
    loader.close()
    return out


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[1] == y[1] and torch.equal(x[2], y[2]) for x, y in zip(a, b))


def test_http_pipe_and_file_urls_deliver_what_local_shards_do(small_spec: dict, local: list[str],
                                                              server: RangeServer) -> None:
    native = _run(small_spec, local, epochs=2)
    assert len(native) == 12
    for shards in (server.urls(local), [f"pipe:cat {p}" for p in local], [f"file://{p}" for p in local]):
        assert _same(_run(small_spec, shards, epochs=2), native), shards[0]
    ranges = [r for m, _, r in server.requests if m == "GET" and r]
    assert len(ranges) < 2 * 23  # coalesced: one request per batch and shard, not one per member


def test_two_ranks_read_the_native_ranges_and_shuffled_epochs_are_exact(small_spec: dict, local: list[str],
                                                                        server: RangeServer) -> None:
    urls, keys = server.urls(local), set()
    for rank in (0, 1):
        native = _run(small_spec, local, rank=rank, world_size=2)
        assert _same(_run(small_spec, urls, rank=rank, world_size=2), native)
        keys |= {k for ks, _, _ in native for k in ks}
    assert len(keys) == 23
    for epoch in (0, 1):
        got = Counter()
        for rank in (0, 1):
            loader = feedfast.DataLoader(small_spec, shards=urls, rank=rank, world_size=2, shuffle=True, num_workers=1)
            loader.set_epoch(epoch)
            mine = [k for keys, _, _ in _epoch(loader) for k in keys]
            loader.set_epoch(epoch)
            assert mine == [k for keys, _, _ in _epoch(loader) for k in keys]  # deterministic
            got.update(mine)
        assert got == Counter(keys)  # every sample exactly once per epoch over both ranks


def test_a_5xx_is_retried_and_a_persistent_404_names_the_url(small_spec: dict, local: list[str],
                                                             server: RangeServer) -> None:
    url = server.urls(local)[0]
    server.faults["/train-0000.tar"] = [500, 503]
    assert fetch_range(url, 512, 16, FAST) == open(local[0], "rb").read()[512:528]
    server.faults["/train-0000.tar"] = [500] * 5
    with pytest.raises(RemoteError, match=r"train-0000\.tar.*HTTP 500.*after 4 tries"):
        fetch_range(url, 0, 16, FAST)
    with pytest.raises(ShardError, match=r"'http://127\.0\.0\.1:\d+/missing\.tar'.*HTTP 404"):
        feedfast.DataLoader(small_spec, shards=f"{server.url}/missing.tar")
    loader = feedfast.DataLoader(small_spec, shards=server.urls(local), num_workers=1, backend="dali")
    server.faults["/train-0002.tar"] = [500]  # mid-epoch, once: the server then recovers
    assert _same(_epoch(loader), _run(small_spec, local))
    assert server.faults["/train-0002.tar"] == []  # the 500 was served, and retried
    server.faults["/train-0003.tar"] = [404] * 10
    with pytest.raises(ShardError, match=r"train-0003\.tar.*HTTP 404"):
        _run(small_spec, server.urls(local))


def test_a_failing_pipe_command_is_an_error_naming_it(small_spec: dict, tmp_path: Path) -> None:
    with pytest.raises(ShardError, match=r"exit 1.*cat /nonexistent/x\.tar.*No such file"):
        feedfast.DataLoader(small_spec, shards="pipe:cat /nonexistent/x.tar", cache_dir=tmp_path)
    with pytest.raises(ShardError, match=r"not a readable tar.*'pipe:true'"):
        feedfast.DataLoader(small_spec, shards="pipe:true", cache_dir=tmp_path)


def test_the_shard_cache_keeps_its_last_copies_read_open_and_reads_on_one_evicted_meanwhile(
        local: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "OPEN", 2)
    cache = ShardCache(str(tmp_path / "shards"))
    urls = [f"pipe:cat {p}" for p in local[:3]]
    data = [Path(p).read_bytes() for p in local[:3]]
    opened: list[str] = []
    real = ShardCache.open
    monkeypatch.setattr(ShardCache, "open", lambda self, url: opened.append(url) or real(self, url))
    for _ in range(3):
        assert cache.read_range(urls[0], 512, 100) == data[0][512:612]
    assert opened == [urls[0]]  # opened (and stamped) once, read three times
    cache.path_for(urls[0]).unlink()  # evicted by another process: the copy kept open still reads
    assert cache.read_range(urls[0], 0, 512) == data[0][:512] and opened == [urls[0]]
    for u, d in zip(urls[1:], data[1:]):
        assert cache.read_range(u, 1024, 10) == d[1024:1034]
    assert list(cache._open) == urls[1:]  # at most OPEN kept: the least recently opened let go
    assert pickle.loads(pickle.dumps(cache)) == cache  # a worker process opens its own


def test_the_shard_cache_evicts_least_recently_used_and_fetches_again(small_spec: dict, local: list[str],
                                                                      tmp_path: Path) -> None:
    size = os.path.getsize(local[0])
    cache = ShardCache(str(tmp_path / "shards"), limit=int(2.5 * size))
    urls = [f"pipe:cat {p}" for p in local[:4]]
    for u in urls:
        cache.ensure(u)
    assert cache.usage() <= 2.5 * size and not cache.path_for(urls[0]).exists() and cache.path_for(urls[3]).exists()
    with cache.open(urls[0]) as f:  # evicted: downloaded again
        assert f.read() == open(local[0], "rb").read()
    native = _run(small_spec, local)
    limited = _run(small_spec, [f"pipe:cat {p}" for p in local], cache_dir=tmp_path / "c2", cache_limit=2 * size)
    assert _same(limited, native)
    assert len(list((tmp_path / "c2" / "shards").glob("*.tar"))) <= 2


def test_resume_mid_epoch_over_http_reproduces_the_remaining_batches(small_spec: dict, local: list[str],
                                                                      server: RangeServer) -> None:
    urls = server.urls(local)
    full = _run(small_spec, urls, epochs=2, shuffle=True)
    part = feedfast.DataLoader(small_spec, shards=urls, shuffle=True, num_workers=2, backend="dali")
    it = iter(part)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(part.state_dict()))
    part.close()
    resumed = feedfast.DataLoader(small_spec, shards=urls, shuffle=True, num_workers=2, backend="dali")
    resumed.load_state_dict(state)
    assert _same(_epoch(resumed) + _epoch(resumed), full[3:])  # the rest of epoch 0, then epoch 1


def test_remote_index_from_a_sidecar_or_one_scan_matches_the_local_scan(local: list[str], tmp_path: Path) -> None:
    folder = tmp_path / "served"
    folder.mkdir()
    for p in local[:2]:
        shutil.copy(p, folder)
    (folder / "train-0001.idx").write_text(format_index(scan_tar(local[1])))
    with RangeServer(folder) as srv:
        for i, name in enumerate(("train-0000.tar", "train-0001.tar")):
            _, samples, size = remote_index(f"{srv.url}/{name}", tmp_path / "cache", FAST)
            assert samples == scan_tar(local[i]) and size == os.path.getsize(local[i])
        gets = {p for m, p, r in srv.requests if m == "GET" and not r}
        assert gets == {"/train-0000.idx", "/train-0000.tar", "/train-0001.idx"}  # 0001 used its sidecar
        before = len(srv.requests)
        remote_index(f"{srv.url}/train-0000.tar", tmp_path / "cache", FAST)
        assert [m for m, _, _ in srv.requests[before:]] == ["HEAD"]  # cached under its validators


def test_pax_tars_stream_with_the_right_offsets_and_ranges_work_without_range_support(tmp_path: Path) -> None:
    path = tmp_path / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i, body in enumerate((b"x" * 700, b"y" * 10)):
            info = tarfile.TarInfo(f"{'long-folder-name/' * 8}s{i}-é.bin")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    with RangeServer(tmp_path, ignore_range=True) as srv:
        _, samples, _ = remote_index(f"{srv.url}/pax.tar", tmp_path / "cache", FAST)
        assert samples == scan_tar(path)
        m = samples[1].members[0]
        assert fetch_range(f"{srv.url}/pax.tar", m.offset, m.size, FAST) == b"y" * 10


def test_shard_lists_keep_remote_entries_and_reject_unknown_schemes(tmp_path: Path) -> None:
    assert resolve_shards("http://h/a-{0..2}.tar") == [f"http://h/a-{i}.tar" for i in range(3)]
    assert resolve_shards("pipe:cut -d, -f1 x-{a,b}.tar") == ["pipe:cut -d, -f1 x-a.tar", "pipe:cut -d, -f1 x-b.tar"]
    assert resolve_shards("s3://b/a-{0,1}.tar,gs://b/c.tar") == ["s3://b/a-0.tar", "s3://b/a-1.tar", "gs://b/c.tar"]
    (tmp_path / "list.txt").write_text("pipe:cat a.tar\nhttps://h/b.tar\n")
    assert resolve_shards(f"@@{tmp_path / 'list.txt'}") == ["pipe:cat a.tar", "https://h/b.tar"]  # @@: its commands asked for
    with pytest.raises(ShardError, match="unsupported shard URL 'ftp://h/a.tar'"):
        resolve_shards("ftp://h/a.tar")


def test_s3_without_fsspec_backends_is_a_clear_error(small_spec: dict, local: list[str],
                                                                            server: RangeServer,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fsspec")
    import importlib
    import sys

    # as if s3fs were not installed (the dev extra installs it): fsspec cannot load its s3 class
    monkeypatch.setitem(sys.modules, "s3fs", None)
    monkeypatch.delitem(importlib.import_module("fsspec.registry")._registry, "s3", raising=False)
    with pytest.raises(ShardError, match=r"s3://bucket/a\.tar.*s3fs"):
        feedfast.DataLoader(small_spec, shards="s3://bucket/a.tar")
    with pytest.raises(ShardError, match=r"s3://bucket/a\.tar.*s3fs"):  # under skip it is cached through fsspec
        feedfast.DataLoader(small_spec, shards="s3://bucket/a.tar", on_error="skip")


def test_http_under_on_error_skip_is_cached_and_checked(small_spec: dict, local: list[str], server: RangeServer,
                                                        tmp_path: Path) -> None:
    loader = feedfast.DataLoader(small_spec, shards=server.urls(local), on_error="skip", cache_dir=tmp_path)
    assert loader.shards.kinds == ("cache",) * 5
    assert _same(_run(small_spec, server.urls(local), on_error="skip", cache_dir=tmp_path), _run(small_spec, local))


def test_an_undecodable_image_over_http_is_named_or_skipped(small_spec: dict, local: list[str],
                                                            tmp_path: Path) -> None:
    with tarfile.open(local[0]) as src, tarfile.open(tmp_path / "bad.tar", "w") as out:
        for m in src:
            data = src.extractfile(m).read()  # type: ignore[union-attr]
            if m.name.endswith(".jpg") and m.name.startswith("train-00000002"):
                data = b"<html>not an image</html>"
            m.size = len(data)
            out.addfile(m, io.BytesIO(data))
    with RangeServer(tmp_path) as srv:
        url = f"{srv.url}/bad.tar"
        with pytest.raises(feedfast.SampleError, match=r"bad\.tar.*'train-00000002'"):
            _run(small_spec, url, cache_dir=tmp_path / "c")
        loader = feedfast.DataLoader(small_spec, shards=url, on_error="skip", cache_dir=tmp_path / "c")
        assert [(s["shard"], s["key"]) for s in loader.skipped_samples()] == [(url, "train-00000002")]
        assert sum(len(keys) for keys, _, _ in _epoch(loader)) == 4


def test_every_scheme_reads_the_same_ranges_through_one_interface(local: list[str], server: RangeServer,
                                                                  tmp_path: Path) -> None:
    data = open(local[1], "rb").read()
    members = [m for s in scan_tar(local[1]) for m in s.members]
    cache = ShardCache(str(tmp_path / "shards"), transfer=FAST)
    url = server.urls(local)[1]
    readers = [(transport_for(name, FAST), name) for name in (local[1], f"file://{local[1]}", url)]
    for transport, name in readers + [(cache, f"pipe:cat {local[1]}")]:  # pipe: through the cache that wraps it
        assert transport.stream(name, lambda f: f.read()) == data, name
        assert all(transport.read_range(name, m.offset, m.size) == data[m.offset:m.offset + m.size] for m in members)
        with pytest.raises(ShardError, match="truncated|ends before|IncompleteRead"):
            transport.read_range(name, len(data) - 4, 8)
    assert transport_for(local[1]).validators(local[1])["size"] == str(len(data))
    assert transport_for(url).validators(url)["content-length"] == str(len(data))
    pipe = transport_for(f"pipe:cat {local[1]}")
    assert not pipe.ranged and pipe.stream(f"pipe:cat {local[1]}", lambda f: f.read()) == data
    with pytest.raises(ShardError, match="no byte ranges.*shard cache"):
        pipe.read_range(f"pipe:cat {local[1]}", 0, 4)


# -- damage is never silent: cut tars, lying sidecars, shards that cannot be fetched --------------------------


def _served(local: list[str], folder: Path, *names: int) -> list[str]:
    folder.mkdir(exist_ok=True)
    for i in names:
        shutil.copy(local[i], folder)
    return [os.path.basename(local[i]) for i in names]


def _cut_after(path: str, samples: int) -> bytes:
    """The tar cut right after its first ``samples`` samples' data: on a member boundary, no end-of-archive."""
    last = scan_tar(path)[samples - 1].members[-1]
    return open(path, "rb").read()[: -(-(last.offset + last.size) // 512) * 512]


def test_a_remote_tar_cut_at_a_member_boundary_is_named_under_raise_and_costs_its_cut_samples_under_skip(
        small_spec: dict, local: list[str], tmp_path: Path) -> None:
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "cut.tar").write_bytes(_cut_after(local[0], 3))  # 3 of its 5 samples, then nothing
    with RangeServer(tmp_path / "served") as srv:
        url = f"{srv.url}/cut.tar"
        with pytest.raises(ShardError, match=r"'http://127\.0\.0\.1:\d+/cut\.tar'.*no end-of-archive block"):
            feedfast.DataLoader(small_spec, shards=url, cache_dir=tmp_path / "c1")  # tarfile read it as whole
        loader = feedfast.DataLoader(small_spec, shards=url, on_error="skip", cache_dir=tmp_path / "c2")
        assert sum(len(keys) for keys, _, _ in _epoch(loader)) == 3
        assert [(s["shard"], s["key"]) for s in loader.skipped_samples()] == [(url, "?")]  # those after the cut
        loader.close()


@pytest.mark.parametrize("scheme", ["http", "pipe"])
def test_a_cached_remote_shards_damage_is_reported_against_its_url_not_the_cache_file(
        small_spec: dict, local: list[str], tmp_path: Path, scheme: str) -> None:
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "cut.tar").write_bytes(_cut_after(local[0], 3))
    with RangeServer(tmp_path / "served") as srv:
        url = f"{srv.url}/cut.tar" if scheme == "http" else f"pipe:cat {tmp_path / 'served' / 'cut.tar'}"
        with pytest.warns(UserWarning, match=rf"{re.escape(repr(url))}.*no end-of-archive block"):
            loader = feedfast.DataLoader(small_spec, shards=url, on_error="skip", cache_dir=tmp_path / "c")
        cached = str(loader.shards.cache.path_for(url))  # type: ignore[union-attr]
        [lost] = loader.skipped_samples()
        assert lost["shard"] == url and lost["key"] == "?"
        assert repr(url) in lost["reason"] and cached not in lost["reason"], lost["reason"]
        loader.close()
        cached_too = r".*cached as" if scheme == "pipe" else ""  # under raise http is read by range, uncached
        with pytest.raises(ShardError, match=rf"{re.escape(repr(url))}.*no end-of-archive block{cached_too}"):
            feedfast.DataLoader(small_spec, shards=url, cache_dir=tmp_path / "c")


def _shifted_labels(path: str, among: range | None = None) -> str:
    """An index of ``path`` whose ``.cls`` offsets point at the next sample's (samples ``among``, default all
    but the last)."""
    samples = scan_tar(path)
    among = range(len(samples) - 1) if among is None else among
    out = []
    for i, s in enumerate(samples):
        label = next(m for m in samples[i + 1 if i in among else i].members if m.ext == "cls")
        out.append(type(s)(s.key, tuple(dataclasses.replace(m, offset=label.offset) if m.ext == "cls" else m
                                        for m in s.members)))
    return format_index(out)


def test_a_sidecar_whose_label_offsets_point_at_the_next_sample_is_not_trusted(
        small_spec: dict, local: list[str], tmp_path: Path) -> None:
    (name,) = _served(local, tmp_path / "served", 0)
    (tmp_path / "served" / name.replace(".tar", ".idx")).write_text(_shifted_labels(local[0]))
    with RangeServer(tmp_path / "served") as srv:  # a shard under 512 KiB: checked whole when opened
        with pytest.warns(UserWarning, match=r"ignoring the index .*train-0000\.idx.*'train-00000000\.cls'.*"
                                             r"of 'train-00000001\.cls', a member of another sample"):
            got = _run(small_spec, f"{srv.url}/{name}", cache_dir=tmp_path / "c1")
    assert [b[:2] for b in got] == [b[:2] for b in _run(small_spec, local[:1])]  # scanned: the right labels


def test_a_sidecar_that_points_mid_shard_labels_at_the_next_sample_is_an_error_never_a_mislabel(
        small_spec: dict, tmp_path: Path) -> None:
    (big,) = make_shards(tmp_path / "local", samples=240, per_shard=240)  # about 1 MB
    samples = scan_tar(big)
    middle = [i for i, s in enumerate(samples) if 400_000 < s.members[0].offset < 600_000]
    (name,) = _served([big], tmp_path / "served", 0)
    (tmp_path / "served" / name.replace(".tar", ".idx")).write_text(_shifted_labels(big, range(middle[0], middle[-1])))
    with RangeServer(tmp_path / "served") as srv:  # the first and last 256 KiB are right: trusted when opened
        url = f"{srv.url}/{name}"
        with pytest.raises(ShardError, match=rf"index of shard '{re.escape(url)}' does not match the tar: sample "
                                             rf"'{samples[middle[0]].key}' has a member at offset \d+.*another sample"):
            _run(small_spec, url, cache_dir=tmp_path / "c1")
        skipped = _run(small_spec, url, on_error="skip", cache_dir=tmp_path / "c2")  # cached and scanned: right
    assert [b[:2] for b in skipped] == [b[:2] for b in _run(small_spec, big)]


def test_a_sidecar_that_lists_half_the_shard_is_not_trusted(local: list[str], tmp_path: Path) -> None:
    (name,) = _served(local, tmp_path / "served", 0)
    (tmp_path / "served" / name.replace(".tar", ".idx")).write_text(format_index(scan_tar(local[0])[:2]))
    with RangeServer(tmp_path / "served") as srv:
        with pytest.warns(UserWarning, match=r"ignoring the index .*train-0000\.idx.*goes on after the last member"):
            _, samples, _ = remote_index(f"{srv.url}/{name}", tmp_path / "cache", FAST)
    assert samples == scan_tar(local[0])  # 5 of 5 (was 2)


def test_a_shard_that_cannot_be_fetched_is_named_under_raise_and_counted_under_skip(
        small_spec: dict, local: list[str], tmp_path: Path) -> None:
    names = _served(local, tmp_path / "served", 0, 1)
    boundary = len(_cut_after(local[1], 3))  # a drop on a member boundary: tarfile took the rest as a whole tar
    with RangeServer(tmp_path / "served") as srv:
        urls = [f"{srv.url}/{n}" for n in names]
        srv.faults[f"/{names[1]}"] = [f"drop:{boundary}"] * 2  # both tries of the download
        loader = feedfast.DataLoader(small_spec, shards=urls, on_error="skip", remote_retries=1,
                                     cache_dir=tmp_path / "c")
        [(shard, key, reason)] = [tuple(s.values()) for s in loader.skipped_samples()]
        assert (shard, key) == (urls[1], "?") and re.search(r"after 2 tries: ShortBody.*cannot be fetched", reason)
        assert sum(len(keys) for keys, _, _ in _epoch(loader)) == 5  # the other shard's samples
        loader.close()
        again = feedfast.DataLoader(small_spec, shards=urls, on_error="skip", cache_dir=tmp_path / "c")
        assert again.skipped_samples() == [] and sum(len(k) for k, _, _ in _epoch(again)) == 10  # recovered: whole
        again.close()
        loader = feedfast.DataLoader(small_spec, shards=urls, remote_retries=1, cache_dir=tmp_path / "c",
                                     backend="dali")
        srv.faults[f"/{names[1]}"] = ["drop"] * 100  # mid-epoch, every ranged read of it
        with pytest.raises(ShardError, match=rf"{re.escape(urls[1])}' at bytes \d+-\d+ after 2 tries: ShortBody"):
            _epoch(loader)
        loader.close()


def test_a_redirect_to_another_scheme_is_refused_naming_it_and_never_followed(local: list[str],
                                                                               tmp_path: Path) -> None:
    import socket

    with socket.socket() as ftp:  # what a redirect to ftp:// would log in to
        ftp.bind(("127.0.0.1", 0))
        ftp.listen(4)
        ftp.settimeout(0.2)
        target = f"ftp://127.0.0.1:{ftp.getsockname()[1]}/a.tar"
        (name,) = _served(local, tmp_path / "served", 0)
        with RangeServer(tmp_path / "served") as srv:
            srv.redirects["/moved.tar"] = target
            srv.redirects["/here.tar"] = f"{srv.url}/{name}"
            url = f"{srv.url}/moved.tar"
            for read in (lambda: fetch_range(url, 0, 512, FAST), lambda: http_validators(url, FAST),
                         lambda: http_stream(url, lambda body: body.read(), FAST)):
                with pytest.raises(RemoteError, match=rf"HTTP 302 .*redirect to {re.escape(target)!s} refused: "
                                                      r"feedfast follows redirects to http\(s\) only"):
                    read()
            with pytest.raises(TimeoutError):
                ftp.accept()  # no connection was made
            moved = f"{srv.url}/here.tar"  # a redirect to http is followed
            assert fetch_range(moved, 0, 512, FAST) == Path(local[0]).read_bytes()[:512]


@pytest.mark.parametrize("read", ["head", "range", "stream"])
def test_a_slow_server_is_given_up_at_the_fetchs_deadline_retries_included_and_its_sockets_closed(
        local: list[str], tmp_path: Path, read: str) -> None:
    """Was: every try waited out its socket timeout (a 40 s HEAD: 4 tries of 30 s, 125 s for a 60 s deadline),
    and an unclosed socket's ResourceWarning was printed."""
    import gc
    import time
    import warnings

    (name,) = _served(local, tmp_path / "served", 0)
    transfer = Transfer(timeout=0.4, retries=3, backoff=0.05, deadline=1.0)  # 4 tries of 0.4 s: 1.75 s unbounded
    with RangeServer(tmp_path / "served") as srv:
        srv.delay = 3.0
        url = f"{srv.url}/{name}"
        calls = {"head": lambda: http_validators(url, transfer), "range": lambda: fetch_range(url, 0, 512, transfer),
                 "stream": lambda: http_stream(url, lambda body: body.read(), transfer)}
        gc.collect()  # sockets other tests left unclosed warn now, not inside the record below
        port = srv.url.rsplit(":", 1)[1].split("/")[0]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            began = time.monotonic()
            with pytest.raises(RemoteError, match=rf"{re.escape(url)}.*after \d tries.*deadline"):
                calls[read]()
            took = time.monotonic() - began
            gc.collect()
    assert took < transfer.deadline + 0.3, f"gave up after {took:.2f} s, the deadline is {transfer.deadline} s"
    assert not [w for w in caught if issubclass(w.category, ResourceWarning) and f", {port})" in str(w.message)]
