"""Indexes of remote shards (http(s), s3, gs), fetched or built once and cached locally.

For ``https://host/train-0001.tar`` feedfast first tries ``https://host/train-0001.idx`` (the
``v1.2`` format that ``feedfast shards index`` and DALI's ``wds2idx`` write). When there is
none (HTTP 404, 403 or 410) or it does not describe the shard, the tar is streamed once
through Python's :mod:`tarfile` (PAX-safe), which costs one full read of the shard.

Either way the index is cached as ``<cache_dir>/remote-index/<sha1>.idx``, the hash taken
over the URL and the shard's validators (ETag, Last-Modified, Content-Length from a ``HEAD``;
ETag, modification time and size for s3/gs): a shard that changes on the server gets a new
index. A server that gives no validators gets a fresh index on every open (its cached file
is rewritten, never trusted).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import warnings
from pathlib import Path
from typing import IO

from feedfast.errors import ShardError
from feedfast.sources.index import Sample, data_end, format_index, group_members, member_of, parse_index, write_atomic
from feedfast.sources.remote import DEFAULT_TRANSFER, RemoteError, Transfer
from feedfast.sources.transport import Transport, transport_for

SIDECAR_MISSING = frozenset({403, 404, 410})


def sidecar_url(url: str) -> str:
    """Where a shard's index would sit next to it: ``.../a.tar`` -> ``.../a.idx``."""
    return (url[: -len(".tar")] if url.endswith(".tar") else url) + ".idx"


def remote_index(url: str, cache_dir: Path, transfer: Transfer = DEFAULT_TRANSFER) -> tuple[Path, list[Sample], int]:
    """The cached index of a remote shard, its samples, and its size in bytes (0 when unknown).

    Raises:
        ShardError: the shard cannot be read, is not a tar, or holds no samples; names the URL.
    """
    transport = transport_for(url, transfer)
    found = transport.validators(url)
    size = _size(found)
    key = hashlib.sha1(f"{url}|{json.dumps(found, sort_keys=True)}".encode()).hexdigest()
    cached = cache_dir / "remote-index" / f"{key}.idx"
    if found and cached.is_file():
        try:
            samples = parse_index(cached.read_text(encoding="utf-8"))
            return cached, samples, size or data_end(samples)
        except (ShardError, ValueError, IndexError, UnicodeDecodeError) as exc:
            warnings.warn(f"rebuilding the unreadable cached index {str(cached)!r} of {url!r}: {exc}", stacklevel=2)
    found_samples = _sidecar(url, transport, size)
    samples = found_samples if found_samples is not None else transport.stream(url, lambda f: scan_stream(f, url))
    if not samples:
        raise ShardError(f"shard holds no samples: {url!r}")
    write_atomic(cached, format_index(samples))
    return cached, samples, size or data_end(samples)


def _size(found: dict[str, str]) -> int:
    text = found.get("content-length") or found.get("size") or ""
    return int(text) if text.isdigit() else 0


def _sidecar(url: str, transport: Transport, size: int) -> list[Sample] | None:
    """The samples of the index next to the shard, or None when there is no usable one."""
    where = sidecar_url(url)
    if where == url:
        return None
    try:
        text = transport.stream(where, lambda stream: stream.read().decode("utf-8"))
    except RemoteError as exc:
        if exc.status in SIDECAR_MISSING:
            return None
        raise
    except UnicodeDecodeError:
        text = ""
    try:
        samples = parse_index(text)
    except (ShardError, ValueError, IndexError) as exc:
        warnings.warn(f"ignoring the index {where!r}: not a v1.2 webdataset index ({exc}); scanning {url!r}",
                      stacklevel=3)
        return None
    if not samples or (size and data_end(samples) > size):
        warnings.warn(f"ignoring the index {where!r}: it does not describe {url!r} ({len(samples)} samples, "
                      f"data up to byte {data_end(samples)}, shard size {size or 'unknown'}); scanning the shard",
                      stacklevel=3)
        return None
    return samples


def scan_stream(stream: IO[bytes], name: str) -> list[Sample]:
    """Read a tar's headers from a forward-only stream and group its files into samples.

    Raises:
        ShardError: the stream is not a tar or ends inside a header; names ``name``.
    """
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            members = [member_of(info) for info in tar if info.isreg()]
    except tarfile.ReadError as exc:
        raise ShardError(f"shard is not a readable tar file: {name!r} ({exc})") from exc
    return group_members(members)
