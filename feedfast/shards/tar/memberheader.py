"""Is the block before a member's data its tar header? The cheap check of an index against its tar.

An index (a sidecar ``.idx``, or any index not made by scanning this very tar) says where
each member's data is. In a tar, the 512 bytes just before a member's data are that
member's own header (after any PAX or GNU extension headers, which come before it), so one
block tells whether the index points where it says: a valid header (its checksum), of a
regular file, of the size the index gives, named for the sample the index names. A reader
that fetches a member can fetch this block with it for the cost of 512 bytes more.

What the block cannot tell: a name too long for its 100 bytes or not ASCII is held in an
extension header before it (the block holds it cut or with ``?`` for other characters); such
names are checked by type, checksum and size only, and keys by the part the block holds.
"""

from __future__ import annotations

from feedfast.shards.tar.fields import ENCODING, first_bad_header, number
from feedfast.shards.tar.members import split_name

BLOCK = 512
NAME_BYTES = 100
_REGULAR = frozenset(b"0\x007")
_HUGE = 8**11  # sizes from here on do not fit the octal field: an extension header holds them
_ZERO = bytes(BLOCK)


def header_name(block: bytes) -> str:
    """The member name a ustar header holds (its ``prefix`` field joined on), as tarfile reads it."""
    name = _nts(block[:NAME_BYTES])
    if block[257:262] == b"ustar" and block[345]:
        name = _nts(block[345:500]) + "/" + name
    return name


def header_problem(block: bytes, *, key: str, size: int) -> str | None:
    """Why ``block`` is not the header of a member of sample ``key`` with ``size`` bytes of data (None: it is).

    The name in the header must have the key ``key`` (split at the first dot of its base
    name, as samples are grouped), unless the key is one a header's name field cannot hold
    whole (100 bytes or more, or not ASCII; see the module docstring).
    """
    found = first_problem([block], [key], [size])
    return None if found is None else found[1]


def first_problem(blocks: list[bytes], keys: list[str], sizes: list[int]) -> tuple[int, str] | None:
    """The first of ``blocks`` that is not the header :func:`header_problem` asks for, and why; None if all are.

    A block whose fields say what is asked (a regular file, its name ``<key>.<ext>`` in the name
    field, its size) passes at about 1 us; the others are then checked whole, their checksums
    together, to say why they fail (a checksum costs a few us a block).
    """
    doubtful = [i for i, (b, k, n) in enumerate(zip(blocks, keys, sizes)) if not _plainly(b, k, n)]
    if not doubtful:
        return None
    full = [i for i in doubtful if len(blocks[i]) == BLOCK and blocks[i] != _ZERO]
    bad = first_bad_header([blocks[i] for i in full]) if full else None
    for i in doubtful:
        block = blocks[i]
        if len(block) != BLOCK or block == _ZERO:
            return i, "there is no member header there"
        if bad is not None and i == full[bad]:
            return i, "the block before it is not a valid tar header"
        why = _field_problem(block, keys[i], sizes[i])
        if why is not None:
            return i, why
    return None


def _plainly(block: bytes, key: str, size: int) -> bool:
    """Whether ``block`` plainly is the header asked for: a regular file named ``<key>.<ext>`` in its name field,
    no prefix field, its size in plain octal (the common case, read without a checksum)."""
    if len(block) != BLOCK or block[156] not in _REGULAR or block[345]:
        return False
    name = key.encode(ENCODING, "surrogateescape") + b"."
    if not block.startswith(name) or block.find(b"/", len(name), NAME_BYTES) >= 0:
        return False
    try:
        return int(block[124:136].rstrip(b"\0 ") or b"0", 8) == size
    except ValueError:
        return False


def _field_problem(block: bytes, key: str, size: int) -> str | None:
    if block[156] not in _REGULAR:
        return f"the header before it is of type {chr(block[156])!r}, not a regular file"
    name = header_name(block)
    try:
        stored = number(block[124:136])
    except ValueError:
        return "the header before it has no readable size"
    if stored != size and size < _HUGE:
        return f"the header before it is of {name!r}, of {stored} bytes, not {size}"
    if split_name(name)[0] != key and fits(key):
        return f"the header before it is of {name!r}, a member of another sample"
    return None


def fits(key: str) -> bool:
    """Whether a name with this key fits a header's name field with its key whole (ASCII, under 100 bytes)."""
    return key.isascii() and len(key) < NAME_BYTES


def _nts(field: bytes) -> str:
    end = field.find(0)
    return (field if end < 0 else field[:end]).decode(ENCODING, "surrogateescape")
