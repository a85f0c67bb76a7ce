"""s3:// shards end to end against a local S3 server (moto) on 127.0.0.1, with fake credentials.

feedfast reads each shard's metadata and index through fsspec (s3fs, which reads ``AWS_ENDPOINT_URL``
and the credentials from the environment) and the samples over signed GETs (or fsspec where signing
declines), on every backend: DALI's own reader (the AWS SDK for C++) is not used.

The server runs in its own process, as a real one would: it never waits on this interpreter's GIL,
which DALI holds while it builds a pipeline.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

import feedfast
from feedfast.errors import ShardError
from feedfast.shards.index import remote as remote_index_module
from feedfast.shards.index.remote import remote_index
from feedfast.shards.index.tarindex import format_index, scan_tar
from feedfast.shards.transport import objectstore, s3http, s3sign
from feedfast.shards.transport.remote import RemoteError, Transfer
from feedfast.shards.transport.transport import transport_for
from feedfast.sources import windows as windows_module
from tests.helpers import keys_of_epoch, shard_with_bad_sample
from tests.s3server import moto_s3

pytest.importorskip("moto", reason="the s3 tests need a local S3 server: pip install -e '.[dev]'")
# s3fs is not skipped for: feedfast cannot index s3:// shards without it, and the dev extra installs it

FAST = Transfer(timeout=5.0, retries=1, backoff=0.01)
SHARDS = "train-{0000..0004}.tar"
@pytest.fixture(scope="module")
def s3(local: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A moto S3 server on 127.0.0.1 in a child process, the AWS variables pointing at it, and a boto3 client.

    Bucket ``bucket`` holds the shards alone (feedfast scans them); bucket ``indexed`` holds
    them with a ``.idx`` beside each (feedfast reads those).
    """
    import boto3

    with moto_s3(tmp_path_factory.mktemp("aws")):
        client = boto3.client("s3")
        for bucket in ("bucket", "indexed"):
            client.create_bucket(Bucket=bucket)
            for p in local:
                client.upload_file(p, bucket, os.path.basename(p))
        for p in local:
            client.put_object(Bucket="indexed", Key=os.path.basename(p)[: -len(".tar")] + ".idx",
                              Body=format_index(scan_tar(p)).encode())
        yield client


Batches = list[tuple[list[str], list[int], torch.Tensor]]


def _batches(loader: feedfast.DataLoader) -> Batches:
    """The rest of the loader's epoch as (real keys, labels, images) per batch; the loader is closed after."""
    out = []
    for images, labels in loader:
        out.append(([k for _, k in loader.last_origins[: loader.last_valid]], labels.tolist(), images.clone()))
    loader.close()
    return out


def _resumed_after_two_batches(spec: dict, url: str, **kw: Any) -> tuple[str, Batches]:
    """A shuffled epoch stopped after two batches, its state through JSON into a new loader: the backend the
    first loader ran on, and the new loader's batches."""
    part = feedfast.DataLoader(spec, shards=url, shuffle=True, **kw)
    it = iter(part)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(part.state_dict()))
    part.close()
    resumed = feedfast.DataLoader(spec, shards=url, shuffle=True, **kw)
    resumed.load_state_dict(state)
    return part.backend, _batches(resumed)


def _run(spec: dict, shards: Any, **kw: Any) -> Batches:
    """One epoch through the DALI backend as (real keys, labels, images) per batch."""
    kw.setdefault("num_workers", 1)
    return _batches(feedfast.DataLoader(spec, shards=shards, backend="dali", **kw))


def _same(a: Batches, b: Batches) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[1] == y[1] and torch.equal(x[2], y[2]) for x, y in zip(a, b))


def test_s3_shards_deliver_what_local_shards_do_pixel_for_pixel(small_spec: dict, local: list[str], s3: Any,
                                                                  tmp_path: Path) -> None:
    on_disk = _run(small_spec, str(Path(local[0]).parent / SHARDS), shuffle=False)
    keys = Counter(k for ks, _, _ in on_disk for k in ks)
    assert len(keys) == 23 and set(keys.values()) == {1}
    for bucket in ("bucket", "indexed"):  # indexed by one scan through s3fs, or from the .idx beside each shard
        loader = feedfast.DataLoader(small_spec, shards=f"s3://{bucket}/{SHARDS}", backend="dali", shuffle=False,
                                     cache_dir=tmp_path / bucket)
        assert loader.shards.kinds == ("s3",) * 5 and loader._partition == "shards"  # read by feedfast's feed
        assert loader.shards.bytes == sum(os.path.getsize(p) for p in local)
        loader.close()
        assert _same(_run(small_spec, f"s3://{bucket}/{SHARDS}", shuffle=False, cache_dir=tmp_path / bucket),
                     on_disk), bucket


def test_two_ranks_over_s3_read_the_local_ranges_and_a_shuffled_epoch_is_exact(small_spec: dict, local: list[str],
                                                                             s3: Any) -> None:
    url = f"s3://bucket/{SHARDS}"
    for rank in (0, 1):
        assert _same(_run(small_spec, url, rank=rank, world_size=2, shuffle=False),
                     _run(small_spec, local, rank=rank, world_size=2, shuffle=False)), rank
    # shuffled, s3 shards are read by feedfast in the block shuffle's order: windows of 2 spread over 8 samples
    shuffled = {**small_spec, "shuffle": {"buffer": 8, "shards": True, "block": 8, "window": 2}}
    got: Counter[str] = Counter()
    for rank in (0, 1):
        got.update(k for ks, _, _ in _run(shuffled, url, rank=rank, world_size=2, shuffle=True) for k in ks)
    assert len(got) == 23 and set(got.values()) == {1}  # every sample exactly once over both ranks
    loader = feedfast.DataLoader(shuffled, shards=url, backend="dali", shuffle=True, num_workers=1)
    assert loader._partition == "block"  # the block shuffle, read by feedfast
    loader.close()


def test_feedfasts_own_s3_reads_index_scan_sidecar_and_validators(local: list[str], s3: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    size, url = os.path.getsize(local[0]), "s3://bucket/train-0000.tar"
    transport = transport_for(url, FAST)
    found = transport.validators(url)
    assert found["size"] == str(size) and found["ETag"].strip('"')
    data = Path(local[0]).read_bytes()
    assert transport.stream(url, lambda f: f.read()) == data
    for m in scan_tar(local[0])[3].members:  # ranged reads, as a global sample order needs them
        assert transport.read_range(url, m.offset, m.size) == data[m.offset:m.offset + m.size]
    with pytest.raises(ShardError, match=r"s3://bucket/train-0000\.tar"):
        transport.read_range(url, size - 4, 8)  # past the end
    for bucket in ("bucket", "indexed"):
        _, samples, got_size = remote_index(f"s3://{bucket}/train-0000.tar", tmp_path / "cache", FAST)
        assert samples == scan_tar(local[0]) and got_size == size
    # the sidecar is what feedfast reads when there is one (the shard is not scanned) ...
    with monkeypatch.context() as m:
        m.setattr(remote_index_module, "scan_stream", lambda *a: pytest.fail("scanned despite a sidecar"))
        _, samples, _ = remote_index("s3://indexed/train-0001.tar", tmp_path / "c1", FAST)
    assert samples == scan_tar(local[1])
    # ... once checked against the tar: one that lists two of its five samples is not trusted, the shard is scanned
    s3.put_object(Bucket="indexed", Key="train-0001.idx", Body=format_index(scan_tar(local[1])[:2]).encode())
    with pytest.warns(UserWarning, match=r"train-0001\.idx.*the tar goes on after the last member listed"):
        _, samples, _ = remote_index("s3://indexed/train-0001.tar", tmp_path / "c2", FAST)
    assert samples == scan_tar(local[1])
    s3.put_object(Bucket="indexed", Key="train-0001.idx", Body=format_index(scan_tar(local[1])).encode())


def test_a_changed_s3_shard_gets_a_new_index(local: list[str], s3: Any, tmp_path: Path) -> None:
    s3.upload_file(local[0], "bucket", "changing.tar")
    _, first, _ = remote_index("s3://bucket/changing.tar", tmp_path, FAST)
    s3.upload_file(local[4], "bucket", "changing.tar")  # new bytes, new ETag: the cached index is not reused
    _, second, size = remote_index("s3://bucket/changing.tar", tmp_path, FAST)
    assert first == scan_tar(local[0]) and second == scan_tar(local[4]) and size == os.path.getsize(local[4])


def test_a_missing_s3_shard_or_bucket_names_the_url(small_spec: dict, s3: Any, tmp_path: Path) -> None:
    with pytest.raises(RemoteError, match=r"shard not found: 's3://bucket/missing\.tar'") as err:
        transport_for("s3://bucket/missing.tar", FAST).validators("s3://bucket/missing.tar")
    assert err.value.status == 404
    for url in ("s3://bucket/missing.tar", "s3://no-such-bucket/a.tar"):
        with pytest.raises(ShardError, match=url.replace(".", r"\.")):
            feedfast.DataLoader(small_spec, shards=url, cache_dir=tmp_path)


def test_on_error_skip_over_s3_caches_checks_and_skips_the_bad_sample(small_spec: dict, local: list[str], s3: Any,
                                                                    tmp_path: Path) -> None:
    good = next(m for m in scan_tar(local[0])[0].members if m.name.endswith(".jpg"))
    with open(local[0], "rb") as f:
        f.seek(good.offset)
        jpeg = f.read(good.size)
    broken = shard_with_bad_sample(tmp_path, jpeg, b"<html>not an image</html>")
    s3.upload_file(broken, "bucket", "broken-0000.tar")
    url = "s3://bucket/broken-0000.tar"
    loader = feedfast.DataLoader(small_spec, shards=url, on_error="skip", backend="dali", shuffle=False,
                                 num_workers=1, cache_dir=tmp_path / "c")
    # downloaded whole through the s3 transport into the shard cache, checked there, read from there
    assert loader.shards.kinds == ("cache",)
    assert Path(loader.shards.cache.path_for(url)).read_bytes() == Path(broken).read_bytes()  # type: ignore[union-attr]
    assert [(s["shard"], s["key"]) for s in loader.skipped_samples()] == [(url, "bad")]
    assert keys_of_epoch(loader) == ["a", "b", "c"]
    loader.close()
    # the whole set under skip, shuffled: every good sample once
    loader = feedfast.DataLoader(small_spec, shards=f"s3://bucket/{SHARDS}", on_error="skip", backend="dali",
                                 shuffle=True, num_workers=1, cache_dir=tmp_path / "c")
    assert loader.shards.kinds == ("cache",) * 5 and not loader.skipped_samples()
    assert Counter(keys_of_epoch(loader)) == Counter(s.key for p in local for s in scan_tar(p))
    loader.close()


def test_resume_mid_epoch_over_s3_reproduces_the_remaining_batches(small_spec: dict, s3: Any) -> None:
    url, shuffled = f"s3://bucket/{SHARDS}", {**small_spec, "shuffle": {"buffer": 8, "shards": True, "block": 8, "window": 2}}
    full = _run(shuffled, url, shuffle=True)
    _, rest = _resumed_after_two_batches(shuffled, url, backend="dali", num_workers=1)
    assert _same(rest, full[2:])


def _threads(spec: dict, shards: Any, **kw: Any) -> tuple[str, str, Batches]:
    """One epoch through ``backend="auto"``: the backend it chose, the order, and (real keys, labels, images)."""
    kw.setdefault("num_workers", 2)
    loader = feedfast.DataLoader(spec, shards=shards, **kw)
    backend, partition = loader.backend, loader._partition
    return backend, partition, _batches(loader)


def test_auto_runs_the_threaded_path_over_s3_exactly(small_spec: dict, local: list[str], s3: Any) -> None:
    url = f"s3://indexed/{SHARDS}"
    for rank in (0, 1):  # unshuffled: the local shards' ranges, bit for bit
        backend, partition, got = _threads(small_spec, url, rank=rank, world_size=2, shuffle=False)
        assert (backend, partition) == ("threads", "shards")
        assert _same(got, _threads(small_spec, local, rank=rank, world_size=2, shuffle=False)[2]), rank
    # shuffled: s3 is read a window at a time (fsspec costs ms a request), in the block shuffle's order
    shuffled = {**small_spec, "shuffle": {"buffer": 8, "shards": True, "block": 8, "window": 2}}
    got_keys: Counter[str] = Counter()
    for rank in (0, 1):
        backend, partition, got = _threads(shuffled, url, rank=rank, world_size=2, shuffle=True)
        assert (backend, partition) == ("threads", "block")
        assert _same(_threads(shuffled, url, rank=rank, world_size=2, shuffle=True)[2], got)  # deterministic
        got_keys.update(k for ks, _, _ in got for k in ks)
    assert len(got_keys) == 23 and set(got_keys.values()) == {1}  # every sample exactly once over both ranks


def test_resume_mid_epoch_over_s3_on_the_threaded_path(small_spec: dict, s3: Any) -> None:
    url, shuffled = f"s3://indexed/{SHARDS}", {**small_spec, "shuffle": {"buffer": 8, "shards": True, "block": 8,
                                                                        "window": 2}}
    full = _threads(shuffled, url, shuffle=True)[2]
    backend, rest = _resumed_after_two_batches(shuffled, url, num_workers=2)
    assert backend == "threads"
    assert _same(rest, full[2:])


def test_an_s3_shard_gone_mid_epoch_names_the_shard_and_sample(small_spec: dict, local: list[str], s3: Any,
                                                               tmp_path: Path) -> None:
    s3.create_bucket(Bucket="fleeting")
    for p in local[:2]:
        s3.upload_file(p, "fleeting", os.path.basename(p))
    urls = [f"s3://fleeting/{os.path.basename(p)}" for p in local[:2]]
    loader = feedfast.DataLoader(small_spec, shards=urls, num_workers=2, remote_retries=0, cache_dir=tmp_path)
    assert loader.backend == "threads"
    s3.delete_object(Bucket="fleeting", Key="train-0001.tar")
    with pytest.raises(ShardError, match=rf"cannot read sample 'train-0000000[5-9]' of shard '{urls[1]}'"):
        for _ in loader:
            pass
    loader.close()


def test_the_pil_backend_reads_s3_in_the_block_order_batch_by_batch(small_spec: dict, s3: Any) -> None:
    url, shuffled = f"s3://indexed/{SHARDS}", {**small_spec, "shuffle": {"buffer": 8, "shards": True, "block": 8,
                                                                        "window": 2}}
    threads = _threads(shuffled, url, shuffle=True)[2]
    backend, partition, pil = _threads(shuffled, url, shuffle=True, backend="pil", num_workers=2)
    assert (backend, partition) == ("pil", "block")
    assert [b[:2] for b in pil] == [b[:2] for b in threads]  # the same samples and labels, batch for batch


def test_s3_bytes_come_over_signed_urls_and_fsspec_reads_them_where_signing_declines(local: list[str], s3: Any,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    url, data = "s3://bucket/train-0000.tar", Path(local[0]).read_bytes()
    transport = transport_for(url, FAST)
    with monkeypatch.context() as m:  # feedfast's http client on a URL botocore signed: fsspec is not asked
        m.setattr(objectstore, "read_range", lambda *a: pytest.fail("read through fsspec"))
        m.setattr(objectstore, "read", lambda *a: pytest.fail("read through fsspec"))
        assert transport.read_range(url, 512, 1000) == data[512:1512]
        assert transport.stream(url, lambda f: f.read()) == data
        with pytest.raises(RemoteError, match=r"shard not found: 's3://bucket/missing\.tar' \(S3: NoSuchKey") as err:
            transport.read_range("s3://bucket/missing.tar", 0, 10)
        assert err.value.status == 404 and "X-Amz-Signature" not in str(err.value)
    read: list[str] = []
    real = objectstore.read_range
    monkeypatch.setattr(s3sign, "signer", lambda: None)  # s3fs configured through fsspec, or no credentials
    monkeypatch.setattr(objectstore, "read_range", lambda *a: read.append(a[0]) or real(*a))
    assert transport.read_range(url, 512, 1000) == data[512:1512] and read == [url]


def test_neighbouring_s3_windows_wanted_at_once_are_one_request_and_the_epoch_is_the_same(
        small_spec: dict, s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url, shuffled = f"s3://indexed/{SHARDS}", {**small_spec, "shuffle": {"buffer": 8, "shards": True, "block": 8,
                                                                        "window": 2}}
    requests: list[int] = []
    real = s3http.read_range
    monkeypatch.setattr(s3http, "read_range", lambda signer, u, offset, size, transfer:
                        requests.append(size) or real(signer, u, offset, size, transfer))

    def epoch() -> tuple[Batches, int]:
        loader = feedfast.DataLoader(shuffled, shards=url, shuffle=True, num_workers=1)
        requests.clear()  # the index checks are behind us: what follows reads samples
        return _batches(loader), len(requests)

    merged, merged_requests = epoch()
    monkeypatch.setattr(windows_module, "MERGE_BYTES", 0)  # a window a request
    single, single_requests = epoch()
    assert single_requests >= 14  # the 23 samples' windows of 2 (3 in each shard of 5, 2 in the last), each once
    # (the next epoch's, read ahead as this one ends, may follow)
    assert merged_requests < single_requests and _same(merged, single)


def test_unshuffled_epochs_over_s3_run_through_one_pipeline_for_the_loaders_life(
        small_spec: dict, s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 36: an unshuffled s3 epoch is fed like any other (no pipeline of DALI's reader per epoch)."""
    from nvidia.dali import Pipeline

    built: list[int] = []
    real = Pipeline.build

    def spy(self: Any, *args: Any, **kw: Any) -> Any:
        if not self._built:
            built.append(1)
        return real(self, *args, **kw)

    monkeypatch.setattr(Pipeline, "build", spy)
    loader = feedfast.DataLoader(small_spec, shards=f"s3://bucket/{SHARDS}", backend="dali", shuffle=False,
                                 num_workers=1, cache_dir=tmp_path)
    epochs = [[k for _ in loader for k in loader.last_origins[: loader.last_valid]] for _ in range(3)]
    loader.close()
    assert len(built) == 1 and len(epochs[0]) == 23 and epochs[0] == epochs[1] == epochs[2]


@pytest.mark.parametrize("backend", ["dali", "threads"])
def test_one_dataset_of_s3_http_and_local_shards_reads_what_local_shards_give(
        small_spec: dict, local: list[str], s3: Any, server: Any, tmp_path: Path, backend: str) -> None:
    """Every backend reads every kind of shard itself, so kinds mix in one dataset (DALI's reader once could not)."""
    names = [f"s3://bucket/{os.path.basename(p)}" for p in local[:2]] + [f"{server.url}/{os.path.basename(local[2])}"]
    names += local[3:]

    def epoch(shards: list[str]) -> Batches:
        return _batches(feedfast.DataLoader(small_spec, shards=shards, backend=backend, shuffle=False, num_workers=1,
                                            cache_dir=tmp_path / "mixed"))

    mixed = epoch(names)
    assert sum(len(keys) for keys, _, _ in mixed) == 23 and _same(mixed, epoch(local))
