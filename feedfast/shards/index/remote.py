"""Indexes of remote shards (http(s), s3, gs), fetched or built once and cached locally.

For ``https://host/train-0001.tar`` feedfast first tries ``https://host/train-0001.idx`` (the
``v1.2`` format that ``feedfast shards index`` and DALI's ``wds2idx`` write). When there is
none (HTTP 404, 403 or 410) or it does not describe the shard, the tar is streamed once
into a temporary file beside the cached indexes and its headers read by feedfast's own tar
scanner (:func:`feedfast.shards.index.tarindex.scan_tar`), as a local shard's are: a remote tar
that is cut short (even exactly at a member boundary), corrupt or sparse is the same error,
naming the URL; this costs one full read of the shard.

A sidecar is checked before it is trusted, with one ranged read or two of at most
:data:`SPAN` bytes each, of the shard's first and last bytes: every member listed there must
sit right after its own tar header (:mod:`.memberheader`: a header of a regular file of that
size, named for that sample), and the block after the last member's data must end the
archive (or be a header of no file). So an index that lists only part of a shard, belongs to
another shard or an older version, or whose offsets are shifted, is not used (a warning says
why, and the shard is scanned); a shard under 512 KiB is checked whole. The samples between
are checked as they are read on the stream path, for the price of the 512 bytes before
each read (:class:`feedfast.sources.memberread.MemberReader`), on every backend.

Either way the index is cached as ``<cache_dir>/remote-index/<sha1>.idx``, the hash taken
over the URL and the shard's validators (ETag, Last-Modified, Content-Length from a ``HEAD``;
ETag, modification time and size for s3/gs): a shard that changes on the server gets a new
index. A server that gives no validators gets a fresh index on every open (its cached file
is rewritten, never trusted).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import IO

from feedfast.errors import ShardError
from feedfast.shards.index.notes import IndexNotes
from feedfast.shards.index.tarindex import (
    RepeatedKeyWarning,
    Sample,
    data_end,
    format_index,
    parse_index,
    repeated_message,
    scan_tar,
    split_duplicates,
    warn_once,
    write_atomic,
)
from feedfast.shards.tar.memberheader import BLOCK, first_problem
from feedfast.shards.tar.scan import padded
from feedfast.shards.transport.remote import DEFAULT_TRANSFER, NOT_THERE, RemoteError, Transfer
from feedfast.shards.transport.transport import Transport, transport_for

SIDECAR_MISSING = NOT_THERE
SPAN = 256 * 1024  # a sidecar is checked on the members of the shard's first and last SPAN bytes
_NO_FILE_TYPES = frozenset(b"1234568")  # headers of links, devices, folders, FIFOs: no data a sample could hold


def sidecar_url(url: str) -> str:
    """Where a shard's index would sit next to it: ``.../a.tar`` -> ``.../a.idx``."""
    return (url[: -len(".tar")] if url.endswith(".tar") else url) + ".idx"


def remote_index(url: str, cache_dir: Path, transfer: Transfer = DEFAULT_TRANSFER) -> tuple[Path, list[Sample], int]:
    """The cached index of a remote shard, its samples, and its size in bytes (0 when unknown).

    Raises:
        ShardError: the shard cannot be read, is not a tar, is damaged (cut, corrupt), or holds
            no samples; names the URL.
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
    if found_samples is None:
        folder = cached.parent
        found_samples = transport.stream(url, lambda f: scan_stream(f, url, folder))
    if not found_samples:
        raise ShardError(f"shard holds no samples: {url!r}")
    write_atomic(cached, format_index(found_samples))
    return cached, found_samples, size or data_end(found_samples)


def unfetched_index(url: str, cache_dir: Path, error: ShardError) -> Path:
    """An index of no samples for a shard that cannot be fetched, ``error`` on its first line
    (:mod:`.indexnotes`): under ``on_error: skip`` the shard's loss is listed as a skip, with why."""
    key = hashlib.sha1(url.encode()).hexdigest()
    return write_atomic(cache_dir / "remote-index" / f"unfetched-{key}.idx",
                        format_index([], IndexNotes(0, damaged=f"{error}; the shard cannot be fetched")))


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
    why = _mismatch(url, transport, samples, size)
    if why is not None:
        warnings.warn(f"ignoring the index {where!r}: it does not describe {url!r} ({why}); scanning the shard",
                      stacklevel=3)
        return None
    return samples


def _mismatch(url: str, transport: Transport, samples: list[Sample], size: int) -> str | None:
    """Why ``samples`` (a sidecar's) do not describe the shard, from the headers of the members in its first
    and last :data:`SPAN` bytes and the block after the last member (see the module docstring); None when
    they do."""
    if not samples or not all(s.members for s in samples):
        return f"{len(samples)} samples, some with no member"
    end = data_end(samples)
    if size and end > size:
        return f"data up to byte {end}, shard size {size}"
    members = [(s.key, m) for s in samples for m in s.members]
    low = min(m.offset for _, m in members)
    if low < BLOCK or min(m.size for _, m in members) < 0:
        return f"a member at offset {low}, where no header fits before it"
    first, last = members[0][1], members[-1][1]
    tail = padded(last.offset + last.size)
    if size and tail + BLOCK > size:
        return f"the shard ends at byte {size}, with no end-of-archive block after the last member listed"
    head = (first.offset - BLOCK, min(first.offset - BLOCK + SPAN, tail + BLOCK))
    back = (max(tail + BLOCK - SPAN, head[0]), tail + BLOCK)
    spans = [(head[0], back[1])] if back[0] <= head[1] else [head, back]
    try:
        reads = [(at, transport.read_range(url, at, stop - at)) for at, stop in spans]
    except RemoteError as exc:
        if exc.status not in (206, 416):  # the shard cannot be read: a scan would fail the same way
            raise
        return str(exc)  # the shard ends before the bytes asked for
    except ShardError as exc:
        return str(exc)
    seen = [(key, m, data[m.offset - BLOCK - at: m.offset - at]) for key, m in members
            for at, data in reads if at <= m.offset - BLOCK and m.offset <= at + len(data)]
    found = first_problem([b for _, _, b in seen], [k for k, _, _ in seen], [m.size for _, m, _ in seen])
    if found is not None:
        member = seen[found[0]][1]
        return f"member {member.name!r} at offset {member.offset}: {found[1]}"
    after = reads[-1][1][-BLOCK:]
    if any(after) and after[156] not in _NO_FILE_TYPES:
        return f"the tar goes on after the last member listed (a header at offset {tail})"
    return None


def scan_stream(stream: IO[bytes], name: str, folder: Path | None = None) -> list[Sample]:
    """Read a tar from a forward-only stream and group its files into samples, as a local shard's are.

    The stream is copied to a temporary file in ``folder`` (the system's temporary folder when
    None), read by :func:`~feedfast.shards.index.tarindex.scan_tar` (feedfast's tar scanner), and
    deleted. A key that comes back later in the tar keeps its first sample only, with the
    warning local shards get.

    Raises:
        ShardError: the stream is not a tar, or is cut short or corrupt (see :mod:`.tarscan`);
            names ``name`` and the offset.
    """
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".scan-", suffix=".tar", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(stream, out, 1 << 20)
        try:
            samples = scan_tar(tmp, keep_duplicates=True)
        except ShardError as exc:  # named for the URL, not the temporary copy
            raise ShardError(str(exc).replace(repr(tmp), repr(name)).replace(tmp, name)) from exc
    finally:
        os.unlink(tmp)
    unique, repeated = split_duplicates(samples)
    if repeated:
        warn_once(repeated_message(name, [s.key for s in repeated]), RepeatedKeyWarning, stacklevel=3)
    return unique
