"""Tar header fields as :mod:`tarfile` reads them: numbers and checksums (one field, or every header at
once), and PAX records.

A number field is octal text ended by a NUL or spaces (``"0000644\\0"``) or, when its first
byte is 0x80 (or 0xff, negative), a big-endian base-256 number in the remaining bytes (GNU
tar's form for sizes of 8 GiB and more). A header is valid when its stored checksum is the
sum of its bytes with the checksum field read as spaces (unsigned, or signed as some old tars
summed them) and every number field reads as a number: :func:`first_bad_header` checks all
the headers of a tar together with NumPy, and the few fields not in the plain octal form with
:func:`number`.
"""

from __future__ import annotations

import re
import sys
from typing import Sequence

import numpy as np

ENCODING = sys.getfilesystemencoding()  # tarfile's default encoding of names, with surrogate escapes

BLOCK = 512
# (start, end) of the number fields tarfile's frombuf reads but the checksum and the size (which the scanner reads
# itself, one header at a time): mode, uid, gid, mtime, devmajor, devminor
FIELDS = ((100, 108), (108, 116), (116, 124), (136, 148), (329, 337), (337, 345))
CHECKSUM = (148, 156)
_WEIGHTS = 8 ** np.arange(5, -1, -1, dtype=np.int64)  # the usual checksum field: 6 octal digits, then NUL


def number(field: bytes) -> int:
    """The value of a number field (tarfile's ``nti``).

    >>> number(b"0000644\\0"), number(b"\\x80" + bytes(10) + b"\\x01"), number(b"       \\0")
    (420, 1, 0)

    Raises:
        ValueError: the field is not a number.
    """
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0o377 else value
    end = field.find(0)
    text = field if end < 0 else field[:end]
    try:
        return int(text, 8)  # the usual case; int() of bytes accepts what str.strip() and int() of str accept, or less
    except ValueError:
        return int(text.decode("ascii").strip() or "0", 8)


def first_bad_header(headers: Sequence[bytes]) -> int | None:
    """The position in ``headers`` (512-byte blocks) of the first one tarfile would refuse, or None."""
    if not headers:
        return None
    rows = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), BLOCK)
    ok = _checksums_match(rows)
    for start, end in FIELDS:
        ok &= _numbers(rows[:, start:end])
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else None


def checksums_match(rows: np.ndarray) -> np.ndarray:
    """Whether each 512-byte header (a row of uint8) holds its own checksum, as tarfile checks it."""
    return _checksums_match(rows)


_SIZE_WEIGHTS = 8 ** np.arange(10, -1, -1, dtype=np.int64)


def sizes_of(rows: np.ndarray) -> np.ndarray:
    """The size field of each 512-byte header (a row of uint8), as :func:`number` reads it; -1 where it is
    not a number. The usual form (11 octal digits, then NUL or space) is read for all rows at once."""
    field = rows[:, 124:136]
    digits = field[:, :11].astype(np.int64) - ord("0")
    usual = ((digits >= 0) & (digits <= 7)).all(axis=1) & ((field[:, 11] == 0) | (field[:, 11] == 32))
    out = np.where(usual, digits @ _SIZE_WEIGHTS, -1)
    for i in np.flatnonzero(~usual):
        try:
            value = number(bytes(field[i]))
        except ValueError:
            continue
        out[i] = value if 0 <= value < 2**62 else -1
    return out


def _numbers(fields: np.ndarray) -> np.ndarray:
    """Whether each row of ``fields`` reads as a number, asked once per distinct value (a tar's modes, owners
    and times repeat). As ``S`` strings the values lose their trailing NULs, which the reading ignores."""
    width = fields.shape[1]
    packed = np.ascontiguousarray(fields).view(np.uint64 if width == 8 else f"S{width}")[:, 0]
    distinct, where = np.unique(packed, return_inverse=True)
    raw = [v.tobytes() if width == 8 else bytes(v) for v in distinct]
    return np.array([_is_number(v) for v in raw], dtype=bool)[where.reshape(-1)]


def _is_number(field: bytes) -> bool:
    try:
        number(field or b"\0")
    except ValueError:
        return False
    return True


def _checksums_match(rows: np.ndarray) -> np.ndarray:
    """Whether each header's stored checksum is its sum, unsigned or signed, with the checksum field as spaces."""
    field = rows[:, 148:156]
    digits = field[:, :6].astype(np.int64) - ord("0")
    usual = ((digits >= 0) & (digits <= 7)).all(axis=1) & (field[:, 6] == 0)
    stored = np.where(usual, digits @ _WEIGHTS, -1)
    for i in np.flatnonzero(~usual):  # another form: read as tarfile reads it (not a number: never matches)
        try:
            stored[i] = min(number(bytes(field[i])), 2**62)
        except ValueError:
            continue
    unsigned = 256 + rows.sum(axis=1, dtype=np.uint32).astype(np.int64) - field.sum(axis=1, dtype=np.uint32)
    ok = stored == unsigned  # the checksum field read as 8 spaces; signed (old tars): every byte over 127 counts 256 less
    for i in np.flatnonzero(~ok):
        ok[i] = stored[i] == unsigned[i] - 256 * int((rows[i, :148] >= 128).sum() + (rows[i, 156:] >= 128).sum())
    return ok


_RECORD = re.compile(rb"(\d+) ([^=]+)=")
_HDRCHARSET = re.compile(rb"\d+ hdrcharset=([^\n]+)\n")
_NAME_FIELDS = frozenset({"path", "linkpath", "uname", "gname"})  # tarfile.PAX_NAME_FIELDS


def pax_records(data: bytes, into: dict[str, str]) -> None:
    """Read the records (``"%d %s=%s\\n"``) of a PAX header's data into ``into``, as tarfile's
    ``_proc_pax`` does: ``hdrcharset`` first, names in UTF-8 (or the archive's encoding under
    ``hdrcharset=BINARY``), a value that is not UTF-8 kept with surrogate escapes.

    Raises:
        ValueError: a record of length zero, or an ``hdrcharset`` record that is not UTF-8 (which
            tarfile lets escape as a UnicodeDecodeError).
    """
    found = _HDRCHARSET.search(data)
    if found is not None:
        into["hdrcharset"] = found.group(1).decode("utf-8")
    names = ENCODING if into.get("hdrcharset") == "BINARY" else "utf-8"
    at = 0
    while (record := _RECORD.match(data, at)) is not None:
        length = int(record.group(1))
        if length == 0:
            raise ValueError("a record of length zero")
        keyword = _decode(record.group(2), "utf-8", "utf-8")
        value = data[record.end(2) + 1:record.start(1) + length - 1]
        into[keyword] = _decode(value, names, ENCODING) if keyword in _NAME_FIELDS else _decode(value, "utf-8", "utf-8")
        at += length


def _decode(value: bytes, encoding: str, fallback: str) -> str:
    """tarfile's _decode_pax_field: strict first, then the fallback encoding with surrogate escapes."""
    try:
        return value.decode(encoding, "strict")
    except UnicodeDecodeError:
        return value.decode(fallback, "surrogateescape")
