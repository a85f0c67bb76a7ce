"""Shard lists: globs, brace patterns, list files, comma-separated lists -> shard paths and URLs.

Remote entries (``http(s)://``, ``pipe:``, ``s3://``, ``gs://``: the prefixes the transports
declare, :data:`feedfast.shards.transport.schemes.REMOTE_PREFIXES`) are brace-expanded and kept as
given: no glob, no existence check (they are checked when indexed); a scheme no transport
declares is refused, naming it. A ``pipe:`` entry
is one command, never split at commas; ``file://`` URLs become local paths.

A list file's contents are data, never commands. ``@list.txt`` holds one shard per line
(blank lines and ``#`` comments skipped; a relative path is relative to the list's folder);
a line is one entry, never split at commas (``a.tar,pipe:touch x`` names one file of that
name), and may itself be a glob, a brace pattern, a URL or another ``@list``. A ``pipe:``
line is refused, naming the file and line, unless the user asks for commands from that
file explicitly by naming it with two at signs: ``@@list.txt`` runs its ``pipe:`` lines
(and only those that start with ``pipe:``), in the shell, from the current directory.
A list named inside a list gets no more than its parent (``@@`` inside ``@list.txt`` is
read as ``@``), and a list that names itself, directly or not, is refused.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Sequence

from feedfast.errors import ShardError
from feedfast.shards.transport import schemes

REMOTE_PREFIXES = schemes.REMOTE_PREFIXES


def expand_braces(pattern: str) -> list[str]:
    """Bash-style brace expansion, zero padding kept: ``a-{00..02}.tar`` -> 3 names."""
    import braceexpand

    return list(braceexpand.braceexpand(pattern))


def resolve_shards(shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Expand what the user gave into an ordered list of local shard paths and remote URLs.

    Accepts a path, a glob (``data/*.tar``), a brace pattern (``train-{0000..0099}.tar``),
    ``file://``, ``http(s)://``, ``s3://`` and ``gs://`` URLs, ``pipe:CMD`` commands, a list
    file (``@shards.txt``, one entry per line), a comma-separated string, or a list of any
    of these. Order is kept; duplicates are an error.

    Raises:
        ShardError: nothing matches, a listed local shard does not exist, or a URL scheme
            is not one feedfast reads (the error names it and the supported ones).
    """
    items = [shards] if isinstance(shards, (str, os.PathLike)) else list(shards)
    if not items:
        raise ShardError("no shards given: pass a path, a glob or a brace pattern, e.g. data/train-{0000..0007}.tar")
    out: list[str] = []
    for item in items:
        out.extend(_expand_one(os.fspath(item), _Lists(commands=True)))
    seen: set[str] = set()
    for p in out:
        if p in seen:
            raise ShardError(f"shard listed twice: {p!r}")
        seen.add(p)
    return out


@dataclass(frozen=True)
class _Lists:
    """Where an entry comes from: whether it may be a ``pipe:`` command, and the list files it is read from."""

    commands: bool
    within: tuple[str, ...] = ()


def _expand_one(item: str, lists: _Lists) -> list[str]:
    if item.startswith(schemes.PIPE.prefixes):  # one command, never split at commas
        return expand_braces(item)
    if "," in item and not lists.within and not os.path.exists(item):
        parts = _split_commas(item)
        if len(parts) > 1:
            return [p for part in parts if part.strip() for p in _expand_one(part.strip(), lists)]
    if item.startswith("@@"):
        return _from_list_file(item[2:], _Lists(lists.commands, lists.within))
    if item.startswith("@"):
        return _from_list_file(item[1:], _Lists(False, lists.within))
    if item.startswith(schemes.FILE.prefixes):
        item = item.split("://", 1)[1]  # a local path from here on: `file://pipe:x` names a file, never a command
    elif schemes.url_kind(item) != schemes.FILE.name:  # a scheme no transport declares is refused here, naming it
        return expand_braces(item)
    paths: list[str] = []
    for pattern in expand_braces(item):
        if glob.has_magic(pattern):
            matched = sorted(glob.glob(pattern))
            if not matched:
                raise ShardError(f"no shard matches {pattern!r}")
            paths.extend(matched)
        else:
            paths.append(pattern)
    # a local file whose name starts like a URL (`pipe:x`, made by a glob or braces) keeps a `./`: never a command
    paths = [os.path.join(os.curdir, p) if p.startswith(REMOTE_PREFIXES) else p for p in paths]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        what = "is a directory" if os.path.isdir(missing[0]) else "not found"
        raise ShardError(f"shard {what}: {missing[0]!r}{more}; given {item!r}")
    return paths


def _split_commas(item: str) -> list[str]:
    """Split at commas outside braces: ``a-{0,1}.tar,b.tar`` -> ``a-{0,1}.tar``, ``b.tar``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(item):
        depth += (ch == "{") - (ch == "}")
        if ch == "," and depth == 0:
            parts.append(item[start:i])
            start = i + 1
    return parts + [item[start:]]


def _from_list_file(path: str, lists: _Lists) -> list[str]:
    """The entries of a list file; its lines are data (see the module docstring)."""
    if os.path.realpath(path) in lists.within:
        raise ShardError(f"shard list file {path!r} names itself (through {' -> '.join(map(repr, lists.within))})")
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f]
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ShardError(f"cannot read shard list file {path!r}: {why}") from exc
    base = os.path.dirname(path)
    inner = _Lists(lists.commands, (*lists.within, os.path.realpath(path)))
    out = []
    for number, e in enumerate(lines, 1):
        if not e or e.startswith("#"):
            continue
        if e.startswith(schemes.PIPE.prefixes) and not lists.commands:
            raise ShardError(f"shard list file {path!r}, line {number}: {e[:200]!r} is a command; a list file's lines "
                             "are data, never run: to run the `pipe:` commands of a list you trust, give it with two at signs "
                             "(`@@list.txt`; a list inside it is read as `@@` only when named so there too)")
        out.extend(_expand_one(_relative_to(base, e), inner))
    if not out:
        raise ShardError(f"shard list file {path!r} lists no shards")
    return out


def _relative_to(base: str, entry: str) -> str:
    """A list line with its relative path (of a shard or of a nested ``@list``) taken from the list's folder."""
    at = "@@" if entry.startswith("@@") else "@" if entry.startswith("@") else ""
    rest = entry[len(at):]
    if os.path.isabs(rest) or "://" in rest or rest.startswith(schemes.PIPE.prefixes):
        return entry
    return at + os.path.join(base, rest)
