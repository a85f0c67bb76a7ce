"""An index checked against its tar before it is trusted, and a shard's content fingerprint.

An index (feedfast's, ``wds2idx``'s, one cached) says where each member's data starts. Before
one is used, :func:`check_against_tar` reads the 512-byte header just before each of those
offsets and checks that it is a tar header (its checksum and number fields, as
:mod:`~feedfast.sources.tarfields` reads them) of a regular file of the size the index gives,
carrying the name the index gives (a name a plain header can hold exactly, ASCII and short
enough, must be there as is; a longer or non-ASCII one lives in a PAX or GNU extension header
before it, and the plain header holds a writer's shortened form of it, so there only the kind
and size are checked). Headers close together are read in one ``pread`` (up to
:data:`SPAN` bytes): a shard of small samples costs a few reads, one of 100 KB images one read
a sample. The count the index's first line declares must be the lines it holds
(:func:`~feedfast.sources.index.parse_index` checks that), and no offset may lie before the
first header or past the end of the file.

:func:`shard_fingerprint` hashes the shard's first :data:`HEAD` bytes (its first member's
header and the start of its data) and last :data:`TAIL` bytes (the end of its last member,
whatever the end-of-archive padding): two small reads. It is recorded with an index and with
an opened dataset's record (:mod:`.snapshot`), so a shard rewritten in place with the same
size and modification time is caught cheaply when either is used. A rewrite that changes
neither end (one label in the middle of a shard) escapes it; an index read whole is checked
header by header as above.
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

from feedfast.errors import ShardError
from feedfast.sources.tarfields import ENCODING, first_bad_header, number

BLOCK = 512
HEAD = 1024
TAIL = 16384  # more than tar's end-of-archive blocks and record padding (at most 2 + 19 blocks)
SPAN = 65536  # headers within this many bytes are read together
REGULAR = frozenset(b"0\x007")


def shard_fingerprint(path: str | os.PathLike[str], size: int | None = None) -> str:
    """A short hash of the shard's size, first :data:`HEAD` bytes and last :data:`TAIL` bytes.

    Raises:
        OSError: the shard cannot be read.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size if size is None else size
        h = hashlib.blake2b(str(size).encode(), digest_size=8)
        h.update(os.pread(fd, HEAD, 0))
        if size > HEAD:
            h.update(os.pread(fd, TAIL, max(HEAD, size - TAIL)))
    finally:
        os.close(fd)
    return h.hexdigest()


def check_bounds(shard: str, members: Sequence[tuple[str, int, int]], size: int) -> None:
    """Each (name, data offset, size) on a block boundary after the first header, and inside the shard.

    Raises:
        ShardError: the first member that is not, naming shard, member and offset.
    """
    for name, offset, length in members:
        if offset < BLOCK or offset % BLOCK or length < 0 or offset + length > size:
            raise ShardError(f"the index of {shard!r} puts member {name!r} at offset {offset} (size {length}), "
                             f"outside the shard's {size} bytes or off its 512-byte blocks")


def check_against_tar(shard: str, members: Sequence[tuple[str, int, int]]) -> None:
    """Check that each (name, data offset, size) follows a header of that regular file in ``shard``.

    ``members`` are in tar order (an index's order). See the module docstring for what is checked.

    Raises:
        ShardError: the shard cannot be read, or the first member whose header does not match,
            naming shard, member, offset and what the header holds.
    """
    try:
        fd = os.open(shard, os.O_RDONLY)
    except OSError as exc:
        raise ShardError(f"cannot read shard {shard!r}: {exc.strerror}") from exc
    try:
        size = os.fstat(fd).st_size
        check_bounds(shard, members, size)
        headers = [offset - BLOCK for _, offset, _ in members]
        for start, end in _spans(headers):
            data = os.pread(fd, headers[end - 1] + BLOCK - headers[start], headers[start])
            _check_span(shard, members[start:end], data, headers[start])
    finally:
        os.close(fd)


def _spans(headers: list[int]) -> list[tuple[int, int]]:
    """[start, end) runs of ``headers`` (ascending offsets) whose blocks lie within :data:`SPAN` bytes."""
    runs = []
    start = 0
    for i in range(1, len(headers) + 1):
        if i == len(headers) or headers[i] < headers[i - 1] or headers[i] + BLOCK - headers[start] > SPAN:
            runs.append((start, i))
            start = i
    return runs


def _check_span(shard: str, members: Sequence[tuple[str, int, int]], data: bytes, base: int) -> None:
    blocks = [data[offset - BLOCK - base: offset - base] for _, offset, _ in members]
    bad = first_bad_header(blocks)
    for i, ((name, offset, length), block) in enumerate(zip(members, blocks)):
        problem = "not a tar header (wrong checksum or number fields)" if i == bad else _mismatch(block, name, length)
        if problem:
            raise ShardError(f"the index of {shard!r} does not describe it: member {name!r} at offset {offset}: the "
                             f"header before it is {problem}")


def _mismatch(block: bytes, name: str, length: int) -> str:
    """What is wrong with ``block`` as the header of the regular file ``name`` of ``length`` bytes ('' if nothing)."""
    if block[156] not in REGULAR:
        return f"not a regular file's (type {chr(block[156])!r})"
    try:
        held = number(block[124:136])
    except ValueError:
        return "unreadable (its size field is not a number)"
    if held != length and length < 8**11:  # from 8 GiB a size lives in a PAX record, the field may hold anything
        return f"of a member of {held} bytes, not {length}"
    end = block.find(0, 0, 100)
    stored = block[:100 if end < 0 else end]
    if block[345]:
        end = block.find(0, 345, 500)
        stored = block[345:500 if end < 0 else end] + b"/" + stored
    if stored.decode(ENCODING, "surrogateescape") == name or not _plain(name):
        return ""
    return f"that of {stored.decode(ENCODING, 'replace')!r}"


def _plain(name: str) -> bool:
    """Whether a plain header's name field holds ``name`` exactly, so every writer puts it there as is (a longer
    one may be split into the ustar prefix, or given in a PAX or GNU long-name header with a shortened form here)."""
    return len(name) <= 100 and name.isascii() and name.isprintable()
