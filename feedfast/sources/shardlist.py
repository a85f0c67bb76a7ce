"""Shard lists: globs, brace patterns, list files, comma-separated lists -> shard paths and URLs.

Remote entries (``http(s)://``, ``pipe:``, ``s3://``, ``gs://``) are brace-expanded and kept
as given: no glob, no existence check (they are checked when indexed). A ``pipe:`` entry
is one command, never split at commas; ``file://`` URLs become local paths.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Iterable, Sequence

from feedfast.errors import ShardError

REMOTE_PREFIXES = ("http://", "https://", "pipe:", "s3://", "gs://")


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
            is not one feedfast reads.
    """
    items = [shards] if isinstance(shards, (str, os.PathLike)) else list(shards)
    if not items:
        raise ShardError("no shards given: pass a path, a glob or a brace pattern, e.g. data/train-{0000..0007}.tar")
    out: list[str] = []
    for item in items:
        out.extend(_expand_one(os.fspath(item)))
    seen: set[str] = set()
    for p in out:
        if p in seen:
            raise ShardError(f"shard listed twice: {p!r}")
        seen.add(p)
    return out


def _expand_one(item: str) -> list[str]:
    if item.startswith("pipe:"):
        return expand_braces(item)
    if "," in item and not os.path.exists(item):
        parts = _split_commas(item)
        if len(parts) > 1:
            return [p for part in parts if part.strip() for p in _expand_one(part.strip())]
    if item.startswith("@"):
        return _from_list_file(item[1:])
    if item.startswith("file://"):
        item = item[len("file://"):]
    if item.startswith(REMOTE_PREFIXES):
        return expand_braces(item)
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", item):
        raise ShardError(f"unsupported shard URL {item!r}: feedfast reads local paths, file://, http(s)://, "
                         "pipe:CMD, s3:// and gs://")
    paths: list[str] = []
    for pattern in expand_braces(item):
        if glob.has_magic(pattern):
            matched = sorted(glob.glob(pattern))
            if not matched:
                raise ShardError(f"no shard matches {pattern!r}")
            paths.extend(matched)
        else:
            paths.append(pattern)
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


def _from_list_file(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f]
    except OSError as exc:
        raise ShardError(f"cannot read shard list file {path!r}: {exc.strerror}") from exc
    base = os.path.dirname(path)
    entries: Iterable[str] = (ln for ln in lines if ln and not ln.startswith("#"))
    out = []
    for e in entries:
        out.extend(_expand_one(e if os.path.isabs(e) or "://" in e or e.startswith("pipe:") else os.path.join(base, e)))
    if not out:
        raise ShardError(f"shard list file {path!r} lists no shards")
    return out
