"""The ``v1.2`` index format DALI's webdataset reader reads, written and read by feedfast::

    v1.2 <number of samples> [feedfast's notes]
    <ext> <data offset> <size> <member name> [<ext> <offset> <size> <name> ...]

one line per sample. The notes are ``name=value`` words that DALI ignores
(:mod:`.indexnotes`). Names and extensions are %-escaped (:func:`escape_name`) so that a line
ends only at a newline and a field only at a space, whatever a PAX header allowed in the name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from feedfast.errors import ShardError
from feedfast.shards.index.notes import IndexNotes, parse_header
from feedfast.shards.tar.members import Sample, collector_paused, new_member, new_sample

INDEX_VERSION = "v1.2"

# %, whitespace (DALI splits fields at C's isspace), control characters, what str.splitlines() splits at
# (\x1c-\x1e, \x85, U+2028, U+2029), other Unicode whitespace, and the surrogates that stand for undecodable bytes
_UNSAFE = re.compile("[%\\s\x00-\x1f\x7f\x85\u2028\u2029\udc80-\udcff]")

def _escape_char(found: re.Match[str]) -> str:
    char = found.group()
    raw = bytes([ord(char) - 0xDC00]) if "\udc80" <= char <= "\udcff" else char.encode("utf-8")
    return "".join(f"%{b:02X}" for b in raw)

def escape_name(name: str) -> str:
    """A member name with what could split an index line or field %-escaped (see the module docstring).

    >>> escape_name("a b%\r\u2028.jpg")
    'a%20b%25%0D%E2%80%A8.jpg'
    """
    return _UNSAFE.sub(_escape_char, name) if _UNSAFE.search(name) else name

def unescape_name(name: str) -> str:
    """The inverse of :func:`escape_name` (bytes that are not UTF-8 come back as surrogate escapes)."""
    return unquote(name, errors="surrogateescape") if "%" in name else name

def format_index(samples: list[Sample], notes: IndexNotes | None = None) -> str:
    """Render samples as a DALI ``v1.2`` index (names %-escaped), with ``notes`` on its first line."""
    notes = notes or IndexNotes(len(samples))
    if notes.count != len(samples):
        raise ValueError(f"the notes count {notes.count} samples, not {len(samples)}")
    lines = [notes.header(INDEX_VERSION)]
    for s in samples:
        lines.append(" ".join(f"{escape_name(m.ext)} {m.offset} {m.size} {escape_name(m.name)}" for m in s.members))
    return "\n".join(lines) + "\n"

def parse_index(text: str) -> list[Sample]:
    """Parse a ``v1.2`` index back into samples (the inverse of :func:`format_index`).

    Raises:
        ShardError: the text is not a ``v1.2`` index, a line is damaged, or it does not hold as
            many samples as its first line declares.
    """
    return parse_index_notes(text)[0]

def parse_index_notes(text: str) -> tuple[list[Sample], IndexNotes]:
    """The samples of a ``v1.2`` index and the notes on its first line (see :func:`parse_index`)."""
    rows = text.split("\n")  # only newlines end a line: escaped names hold no other line break
    try:
        notes = parse_header(rows[0].rstrip("\r"), INDEX_VERSION)
    except ValueError as exc:
        raise ShardError(f"not a {INDEX_VERSION} webdataset index: {exc}") from None
    with collector_paused():
        samples = _parse_rows(rows)
    if len(samples) != notes.count:
        raise ShardError(f"the index declares {notes.count} samples on its first line but lists {len(samples)}")
    return samples, notes

def _parse_rows(rows: list[str]) -> list[Sample]:
    samples = []
    for number, row in enumerate(rows[1:], 1):
        f = row.rstrip("\r").split(" ")  # a Windows line end; an escaped name holds no \r
        if len(f) % 4 or not row.strip():
            if row.strip():
                raise ShardError(f"line {number + 1} of the index is damaged: {len(f)} fields, not 4 a member")
            continue
        members = []
        try:
            for i in range(0, len(f), 4):
                name = f[i + 3]
                if "%" in name:
                    name = unescape_name(name)
                slash = name.rfind("/") + 1
                dot = name.find(".", slash)
                ext = unescape_name(f[i]) if "%" in f[i] else f[i]
                members.append(new_member(name if dot < 0 else name[:dot], ext, int(f[i + 1]), int(f[i + 2]), name))
        except ValueError as exc:
            raise ShardError(f"line {number + 1} of the index is damaged: {exc}") from None
        samples.append(new_sample(members[0].key, tuple(members)))
    return samples

def read_text(path: str | os.PathLike[str]) -> str:
    """An index file's text as written (no newline translation: ``\\r`` is not a line end)."""
    return Path(path).read_bytes().decode("utf-8")
