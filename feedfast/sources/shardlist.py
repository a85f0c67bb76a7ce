"""Shard lists: globs, brace patterns, list files, comma-separated lists -> local paths."""

from __future__ import annotations

import glob
import os
from typing import Iterable, Sequence

from feedfast.errors import ShardError

REMOTE_PREFIXES = ("http://", "https://", "pipe:", "s3://", "gs://")


def expand_braces(pattern: str) -> list[str]:
    """Bash-style brace expansion, zero padding kept: ``a-{00..02}.tar`` -> 3 names."""
    import braceexpand

    return list(braceexpand.braceexpand(pattern))


def resolve_shards(shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Expand what the user gave into an ordered list of local shard paths.

    Accepts a path, a glob (``data/*.tar``), a brace pattern (``train-{0000..0099}.tar``),
    ``file://`` URLs, a list file (``@shards.txt``, one entry per line), a comma-separated
    string, or a list of any of these. Order is kept; duplicates are an error.

    Raises:
        ShardError: nothing matches, a listed shard does not exist, or a URL scheme is
            not readable by this transport.
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
    if "," in item and not os.path.exists(item):
        return [p for part in item.split(",") if part.strip() for p in _expand_one(part.strip())]
    if item.startswith("@"):
        return _from_list_file(item[1:])
    if item.startswith("file://"):
        item = item[len("file://"):]
    if item.startswith(REMOTE_PREFIXES):
        raise ShardError(
            f"remote shards are not supported yet: {item!r} (this version reads local files; "
            "copy the shards locally or mount them)"
        )
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
        out.extend(_expand_one(e if os.path.isabs(e) or "://" in e else os.path.join(base, e)))
    if not out:
        raise ShardError(f"shard list file {path!r} lists no shards")
    return out
