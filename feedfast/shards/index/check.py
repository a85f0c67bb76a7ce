"""An index checked against its tar before it is trusted, and a shard's content fingerprint.

An index (feedfast's, ``wds2idx``'s, one cached) says where each member's data starts. Before
one is used, :func:`check_against_tar` reads the 512-byte header just before each of those
offsets and checks that it is a tar header (its checksum, as :mod:`tarfile` checks it) of a
regular file of the size the index gives, carrying the name the index gives. A name a plain
header holds exactly (ASCII, printable, at most 100 characters) must be there as is; a longer
or non-ASCII one lives in a PAX or GNU extension header before it, and each writer puts its
own shortened form in the plain header, so there the kind and size are checked, and the shortened
form must not be the start of another member's name the index lists (tarfile and GNU tar keep a
long name's first bytes: a swapped offset shows). Headers
close together are read in one ``pread`` (up to :data:`SPAN` bytes): a shard of small samples
costs a few reads, one of 100 KB images a read a sample; the fields of all headers are compared
at once with NumPy. The count the index's first line declares must be the lines it holds
(:func:`~feedfast.shards.index.tarindex.parse_index` checks that), and no offset may lie before the
first header, off a block boundary or past the end of the file (:func:`check_bounds`). A whole
index reaches the tar's last member (:func:`goes_on_after`): after the member it lists last come
only the end-of-archive blocks (or the end of the file), or headers of members that hold no sample
(folders, links, extension headers), walked over; one block read, most often.

:func:`shard_fingerprint` hashes the shard's size, its first :data:`HEAD` bytes (its first
member's header and the start of its data) and the :data:`HEAD` bytes that end its last
non-zero block (the end of its last member, found in the last :data:`TAIL` bytes, past the
end-of-archive padding); the fingerprint names where that block is, so checking it again
(:func:`fingerprint_matches`) costs two reads of 1 KiB. It is recorded with an index and with an
opened dataset's record (:mod:`.snapshot`), so a shard rewritten in place with the same size
and modification time is caught cheaply when either is used. A rewrite that changes neither
end (one label in the middle of a shard) escapes it; an index read whole is also checked
header by header as above.
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

import numpy as np

from feedfast.errors import ShardError
from feedfast.shards.tar.fields import ENCODING, checksums_match, first_bad_header, number, sizes_of
from feedfast.shards.tar.memberheader import header_name

BLOCK = 512
HEAD = 1024
TAIL = 16384  # more than tar's end-of-archive blocks and record padding (at most 2 + 19 blocks)
SPAN = 65536  # headers within this many bytes are read together
NAME = 100  # the name field of a plain header
REGULAR = np.frombuffer(b"0\x007", dtype=np.uint8)
NO_DATA_TYPES = frozenset(b"123456")  # links, devices, folders, FIFOs: no data a sample could hold
EXTENSIONS = frozenset(b"xXgLK")  # PAX and GNU headers: they describe the member after them


def shard_fingerprint(path: str | os.PathLike[str], size: int | None = None) -> str:
    """``<offset>:<hash>``: a short hash of the shard's size, first :data:`HEAD` bytes and the :data:`HEAD`
    bytes ending at its last non-zero block, which starts at ``offset`` (see the module docstring).

    Raises:
        OSError: the shard cannot be read.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size if size is None else size
        start = max(0, size - TAIL)
        tail = os.pread(fd, size - start, start)
        last = len(tail.rstrip(b"\0"))
        end = start + -(-last // BLOCK) * BLOCK if last else size
        return _fingerprint(fd, size, max(0, end - HEAD))
    finally:
        os.close(fd)


def fingerprint_matches(path: str | os.PathLike[str], recorded: str, size: int | None = None) -> bool:
    """Whether the shard still has the fingerprint ``recorded`` (two reads of :data:`HEAD` bytes).

    Raises:
        OSError: the shard cannot be read.
    """
    where, _, _ = recorded.partition(":")
    if not where.isdigit():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        return _fingerprint(fd, os.fstat(fd).st_size if size is None else size, int(where)) == recorded
    finally:
        os.close(fd)


def _fingerprint(fd: int, size: int, tail: int) -> str:
    h = hashlib.blake2b(f"{size}:{tail}".encode(), digest_size=8)
    h.update(os.pread(fd, HEAD, 0))
    h.update(os.pread(fd, HEAD, tail))
    return f"{tail}:{h.hexdigest()}"


def check_bounds(shard: str, names: Sequence[str], offsets: Sequence[int], sizes: Sequence[int], total: int) -> None:
    """Each member's data on a block boundary after the first header, and inside the shard's ``total`` bytes.

    Raises:
        ShardError: the first member that is not, naming shard, member and offset.
    """
    at, length = np.asarray(offsets, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    bad = np.flatnonzero((at < BLOCK) | (at % BLOCK != 0) | (length < 0) | (at + length > total))
    if len(bad):
        i = int(bad[0])
        raise ShardError(f"the index of {shard!r} puts member {names[i]!r} at offset {offsets[i]} (size {sizes[i]}), "
                         f"outside the shard's {total} bytes or off its 512-byte blocks")


def check_against_tar(shard: str, names: Sequence[str], offsets: Sequence[int], sizes: Sequence[int]) -> None:
    """Check that each member's data (``offsets``, ``sizes``) follows a header of that regular file in ``shard``.

    The members are in tar order (an index's order). See the module docstring for what is checked.

    Raises:
        ShardError: the shard cannot be read, or the first member whose header does not match,
            naming shard, member, offset and what the header holds.
    """
    if not names:
        return
    try:
        fd = os.open(shard, os.O_RDONLY)
    except OSError as exc:
        raise ShardError(f"cannot read shard {shard!r}: {exc.strerror}") from exc
    try:
        check_bounds(shard, names, offsets, sizes, os.fstat(fd).st_size)
        rows = _headers(fd, [offset - BLOCK for offset in offsets])
    finally:
        os.close(fd)
    expected = [name.encode(ENCODING, "surrogateescape") for name in names]
    plain = np.array([_plain(n, e) for n, e in zip(names, expected)])
    wanted = np.frombuffer(b"".join(e[:NAME].ljust(NAME, b"\0") for e in expected), dtype=np.uint8).reshape(-1, NAME)
    length = np.asarray(sizes, dtype=np.int64)
    named = (rows[:, :NAME] == wanted).all(axis=1) & (rows[:, 345] == 0)  # a long name's first 100 bytes: named too
    ok = (checksums_match(rows) & np.isin(rows[:, 156], REGULAR) & ((sizes_of(rows) == length) | (length >= 8**11))
          & (~plain | named))
    for i in np.flatnonzero(~ok).tolist():  # read again one by one: a form the fast path does not read
        problem = _mismatch(bytes(rows[i]), names[i], sizes[i])
        if problem:
            raise ShardError(f"the index of {shard!r} does not describe it: member {names[i]!r} at offset {offsets[i]}: "
                             f"the header before it is {problem}")
    starts: dict[int, dict[str, str]] = {}
    for i in np.flatnonzero(~plain & ~named).tolist():  # a long name shortened otherwise: maybe another's start
        other = _held_by_another(bytes(rows[i]), names, i, starts)
        if other is not None:
            raise ShardError(f"the index of {shard!r} does not describe it: member {names[i]!r} at offset {offsets[i]}: "
                             f"the header before it holds {header_name(bytes(rows[i]))!r}, the start of another "
                             f"member the index lists ({other!r})")


def goes_on_after(shard: str, offsets: Sequence[int], sizes: Sequence[int]) -> str | None:
    """Where the tar goes on with a member after the last of these members (data ``offsets``, ``sizes``), else None.

    A whole index's last member is the tar's last: after it come the end-of-archive blocks or the end of
    the file, or only headers of members that hold no sample (walked over). A regular file's header, or a
    block that is not a valid header, says the index stops short (or the tar is damaged after it: a scan
    says so).

    Raises:
        ShardError: the shard cannot be read.
    """
    if not offsets:
        return None
    last = int(np.argmax(np.asarray(offsets, dtype=np.int64) + np.asarray(sizes, dtype=np.int64)))
    at = offsets[last] + -(-max(0, sizes[last]) // BLOCK) * BLOCK
    try:
        with open(shard, "rb") as f:
            while True:
                f.seek(at)
                block = f.read(BLOCK)
                if len(block) < BLOCK or not any(block):
                    return None
                kind, valid = block[156], first_bad_header([block]) is None
                folder = kind in b"0\x00" and block[:NAME].split(b"\0", 1)[0].endswith(b"/")  # a v7 folder
                if valid and (kind in NO_DATA_TYPES or kind in EXTENSIONS or folder):
                    at += BLOCK + (-(-number(block[124:136]) // BLOCK) * BLOCK if kind in EXTENSIONS else 0)
                    continue
                what = "a member header" if valid else "a block that is not a tar header"
                return f"the tar goes on after the last member it lists ({what} at offset {at})"
    except OSError as exc:
        raise ShardError(f"cannot read shard {shard!r}: {exc.strerror}") from exc
    except ValueError:  # a size field that is not a number
        return f"the tar goes on after the last member it lists (an unreadable header at offset {at})"


def _headers(fd: int, headers: list[int]) -> np.ndarray:
    """The 512-byte blocks at ``headers`` as rows, read a run of close ones at a time."""
    blocks = []
    start = 0
    for i in range(1, len(headers) + 1):
        if i == len(headers) or headers[i] < headers[i - 1] or headers[i] + BLOCK - headers[start] > SPAN:
            base = headers[start]
            data = os.pread(fd, headers[i - 1] + BLOCK - base, base)
            blocks += [data[h - base: h - base + BLOCK] for h in headers[start:i]]
            start = i
    return np.frombuffer(b"".join(blocks), dtype=np.uint8).reshape(len(headers), BLOCK)


def _mismatch(block: bytes, name: str, length: int) -> str:
    """What is wrong with ``block`` as the header of the regular file ``name`` of ``length`` bytes ('' if nothing)."""
    if not checksums_match(np.frombuffer(block, dtype=np.uint8).reshape(1, BLOCK))[0]:
        return "not a tar header (its checksum is wrong)"
    if block[156] not in REGULAR:
        return f"not a regular file's (type {chr(block[156])!r})"
    try:
        held = number(block[124:136])
    except ValueError:
        return "unreadable (its size field is not a number)"
    if held != length and length < 8**11:  # from 8 GiB a size lives in a PAX record, the field may hold anything
        return f"of a member of {held} bytes, not {length}"
    end = block.find(0, 0, NAME)
    stored = block[:NAME if end < 0 else end]
    if block[345]:
        end = block.find(0, 345, 500)
        stored = block[345:500 if end < 0 else end] + b"/" + stored
    if stored.decode(ENCODING, "surrogateescape") == name or not _plain(name, name.encode(ENCODING, "surrogateescape")):
        return ""
    return f"that of {stored.decode(ENCODING, 'replace')!r}"


def _held_by_another(block: bytes, names: Sequence[str], i: int, starts: dict[int, dict[str, str]]) -> str | None:
    """The other listed member whose name starts with the shortened name ``block`` holds, when it is not the start
    of ``names[i]`` (tarfile and GNU tar keep a long name's first 99 or 100 bytes there); else None. A name that
    is not ASCII, or a shortened form no other member's name starts with (libarchive's), says nothing."""
    name = names[i]
    held = header_name(block)
    if not held or not (name.isascii() and name.isprintable()) or name.startswith(held):
        return None
    by_start = starts.setdefault(len(held), {n[:len(held)]: n for n in reversed(names)})  # the first of a start wins
    return by_start.get(held)


def _plain(name: str, encoded: bytes) -> bool:
    """Whether a plain header's name field holds ``name`` exactly, so every writer puts it there as is (a longer
    one may be split into the ustar prefix, or given in a PAX or GNU long-name header with a shortened form here)."""
    return len(encoded) <= NAME and name.isascii() and name.isprintable()
