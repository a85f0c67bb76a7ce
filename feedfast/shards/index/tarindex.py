"""Tar indexes for DALI's webdataset reader, built in Python and safe for PAX tars.

DALI's own tar parser misreads PAX and GNU long-name members (empty components, DALI
issues #3640 and #5440). Python's :mod:`tarfile` reads those headers correctly, and
:mod:`feedfast.shards.tar.scan` reads them as tarfile does, faster, so feedfast writes the
index itself, in the format DALI's ``wds2idx`` writes::

    v1.2 <number of samples>
    <ext> <data offset> <size> <member name> [<ext> <offset> <size> <name> ...]

one line per sample, the components of a sample being consecutive members that share the
basename up to the first dot of the file name. A key that comes back later in the same tar
(``a.jpg a.cls b.jpg b.cls a.jpg a.cls``) is a duplicate: the index keeps its first sample
and leaves the later ones out, with a warning naming the shard and keys
(``feedfast shards inspect`` lists them too), so no sample is delivered twice; so is a key whose
member names come back in one run of members (``a.jpg a.cls a.jpg a.cls``: two copies of ``a``).
An index lives next to its shard (``train-0000.tar`` -> ``train-0000.idx``) when that folder is
writable, otherwise in feedfast's cache folder under a name derived from the shard's path,
size, mtime and content fingerprint.

An index is checked before it is trusted (:mod:`.indexcheck`): it must be at least as new as
the shard, list as many samples as its first line declares, carry the shard's content
fingerprint when it records one, and each member's offset must follow that member's tar
header. One that fails is rebuilt from the tar, with a warning saying why. What feedfast
learned when indexing (the fingerprint, repeated keys, damage) is kept on the index's first
line (:mod:`.indexnotes`). A damaged tar is an error naming shard and offset; with
``salvage`` (``on_error: skip``) its complete samples before the damage are indexed instead,
into the cache folder, and the index says what was lost (:func:`left_out`).

Names may hold any character a PAX header can (``\r``, U+2028, bytes that are not UTF-8):
the index %-escapes ``%``, whitespace, control characters, Unicode line breaks and undecodable
bytes (:func:`escape_name`), so each sample stays on one line of one word per field, for
DALI's parser and for feedfast's.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from pathlib import Path
from typing import Iterator

from feedfast.errors import ShardError
from feedfast.shards.index.check import (
    check_against_tar,
    check_bounds,
    fingerprint_matches,
    goes_on_after,
    shard_fingerprint,
)
from feedfast.shards.index.notes import IndexNotes, parse_header
from feedfast.shards.index.textformat import (
    INDEX_VERSION,
    escape_name,
    format_index,
    parse_index,
    parse_index_notes,
    read_text,
    unescape_name,
)
from feedfast.shards.tar.members import (
    Member,
    Sample,
    collector_paused,
    data_end,
    first_member,
    group_members,
    member_of,
    split_duplicates,
    split_name,
)
from feedfast.shards.tar.samples import (
    RepeatedKeyWarning,
    Scanned,
    forget_warning,
    repeated_message,
    salvage_tar,
    scan_tar,
    warn_once,
)

__all__ = ["INDEX_VERSION", "Member", "RepeatedKeyWarning", "Sample", "Scanned", "cached_index_path", "checked_index",
           "collector_paused", "data_end", "default_index_path", "escape_name", "first_member", "forget_warning",
           "format_index", "fresh_samples", "group_members", "index_candidates", "left_out", "load_index", "member_of", "parse_index",
           "parse_index_notes", "read_index", "read_text", "repeated_message", "salvage_tar", "scan_tar",
           "shard_digest", "split_duplicates", "split_name", "subset_index", "unescape_name", "warn_once",
           "write_atomic", "write_index"]


def default_index_path(shard: str | os.PathLike[str]) -> Path:
    """Where the index of a local shard lives when its folder is writable."""
    p = Path(shard)
    stem = p.name[: -len(".tar")] if p.name.endswith(".tar") else p.name
    return p.with_name(stem + ".idx")

def index_candidates(shard: str | os.PathLike[str], cache_dir: Path) -> Iterator[Path]:
    """Where a shard's index may be, in the order :func:`load_index` looks: beside it, then in the cache (whose
    name, from the shard's fingerprint, is worked out only when asked for)."""
    yield default_index_path(shard)
    yield cached_index_path(shard, cache_dir)


def shard_digest(shard: str | os.PathLike[str], *extra: object) -> str:
    """A short hash of a local shard's identity (path, size, mtime, content fingerprint) and ``extra``: a cache
    key, so what is cached about a shard rewritten in place with the same size and mtime is not used."""
    st = os.stat(shard)
    text = "|".join(map(str, (os.path.abspath(shard), st.st_size, st.st_mtime_ns, shard_fingerprint(shard, st.st_size),
                              *extra)))
    return hashlib.sha1(text.encode()).hexdigest()[:16]

def cached_index_path(shard: str | os.PathLike[str], cache_dir: Path) -> Path:
    """The cache-folder location of a shard's index, keyed by path, size, mtime and content fingerprint."""
    return cache_dir / "index" / f"{Path(shard).stem}-{shard_digest(shard)}.idx"

def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file renamed into place (readers never see half a file; two
    threads or processes writing it at once each write their own temporary file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path

def read_index(path: str | os.PathLike[str], shard: str, expect: int | None = None) -> list[Sample]:
    """The samples of an index file that describes ``shard``.

    Raises:
        ShardError: the index cannot be read, is damaged, does not list the samples its first
            line declares (or ``expect``: the shard changed since it was opened), or puts a
            member outside a local shard.
    """
    try:
        samples = parse_index(read_text(path))
        if os.path.isfile(shard):
            members = [m for s in samples for m in s.members]
            check_bounds(shard, [m.name for m in members], [m.offset for m in members], [m.size for m in members],
                         os.path.getsize(shard))
    except (OSError, UnicodeDecodeError, ValueError, ShardError) as exc:
        raise ShardError(f"cannot read the index {os.fspath(path)!r} of {shard!r}: {exc}") from exc
    if expect is not None and len(samples) != expect:
        raise ShardError(f"the index {os.fspath(path)!r} of {shard!r} now lists {len(samples)} samples, not {expect}: "
                         "the shard changed since it was opened; open it again")
    return samples

def subset_index(shard: str | os.PathLike[str], samples: list[Sample], cache_dir: Path, folder: str) -> str:
    """An index listing just ``samples`` of a shard (repeats allowed), cached under ``cache_dir/folder``.

    DALI reads exactly the samples an index lists, so leaving samples out (missing
    components, bad images) or drawing them (mixing) is an index. The file is keyed by the
    shard's path, size and mtime and by its contents, and written once.
    """
    text = format_index(samples)
    out = cache_dir / folder / f"{Path(shard).stem}-{shard_digest(shard, text)}.idx"
    return str(out if out.is_file() else write_atomic(out, text))

def fresh_samples(shard: str | os.PathLike[str], index: Path) -> list[Sample] | None:
    """The samples of an existing index that still describes the shard, else None (see :func:`checked_index`)."""
    found = checked_index(shard, index)
    return found[0] if isinstance(found, tuple) else None

def checked_index(shard: str | os.PathLike[str], index: Path) -> tuple[list[Sample], IndexNotes] | str | None:
    """An existing index's samples and notes when it describes the shard; else why not, or None when there is
    no such index or it is older than the shard (no fault: it is simply out of date).

    It describes the shard when it is as new as the shard, reads as a ``v1.2`` index listing
    the samples its first line declares, carries the shard's fingerprint if it records one,
    lists no key twice, every member's offset follows that member's header in the tar
    (:func:`~feedfast.shards.index.check.check_against_tar`), and (unless it records damage) its last
    member is the tar's last (:func:`~feedfast.shards.index.check.goes_on_after`).
    """
    shard = os.fspath(shard)
    try:
        ist, sst = index.stat(), os.stat(shard)
    except OSError:
        return None
    if ist.st_mtime_ns < sst.st_mtime_ns:
        return None
    try:
        samples, notes = parse_index_notes(read_text(index))
    except (ShardError, UnicodeDecodeError, OSError) as exc:
        return f"it cannot be read ({exc})"
    try:
        if notes.fingerprint and not fingerprint_matches(shard, notes.fingerprint, sst.st_size):
            return ("the shard's content fingerprint differs from the one recorded with the index: the shard was "
                    "rewritten since it was indexed")
        if not samples and not notes.damaged:
            return "it lists no sample"
        twice = _repeated_key(samples)
        if twice is not None:
            return f"it lists key {twice!r} twice"
        foreign = _foreign_member(samples)
        if foreign is not None:
            return foreign
        members = [m for s in samples for m in s.members]
        offsets, sizes = [m.offset for m in members], [m.size for m in members]
        check_against_tar(shard, [m.name for m in members], offsets, sizes)
        short = None if notes.damaged else goes_on_after(shard, offsets, sizes)  # a salvaged index stops at damage
        if short is not None:
            return short
    except (ShardError, OSError) as exc:
        return str(exc)
    return samples, notes

def _repeated_key(samples: list[Sample]) -> str | None:
    """A key the samples hold twice (on two lines, or one member name twice on a line), else None."""
    keys: set[str] = set()
    for s in samples:
        if s.key in keys or (len(s.members) > 1 and len({m.name for m in s.members}) < len(s.members)):
            return s.key
        keys.add(s.key)
    return None


def _foreign_member(samples: list[Sample]) -> str | None:
    """Why a sample's line lists a member named for another sample (two lines' entries swapped), else None."""
    for s in samples:
        for m in s.members:
            if m.key != s.key:
                return (f"member {m.name!r} at offset {m.offset} is listed with sample {s.key!r}: its name is of "
                        f"sample {m.key!r}")
    return None

def write_index(shard: str | os.PathLike[str], index: Path, samples: list[Sample] | None = None,
                notes: IndexNotes | None = None) -> Path:
    """Scan ``shard`` (unless ``samples`` are given) and write its index atomically, with the shard's
    fingerprint and ``notes`` (repeated keys, damage) on its first line."""
    samples = scan_tar(shard) if samples is None else samples
    notes = notes or IndexNotes(len(samples))
    if not samples and not notes.damaged:
        raise ShardError(f"shard holds no samples: {os.fspath(shard)!r}")
    notes = IndexNotes(len(samples), shard_fingerprint(shard), notes.repeated, notes.damaged, notes.lost)
    return write_atomic(index, format_index(samples, notes))

def load_index(shard: str | os.PathLike[str], cache_dir: Path, *, salvage: bool = False,
               name: str | None = None) -> tuple[Path, list[Sample]]:
    """Return a checked index of a local shard and its samples, building it if needed.

    Looks next to the shard, then in ``cache_dir`` (:func:`checked_index`; an index found
    there that does not describe the shard is rebuilt, with a warning saying why); builds next
    to the shard when that folder is writable, else in ``cache_dir``.

    Args:
        shard: a local tar file.
        cache_dir: feedfast's cache folder.
        salvage: index a damaged tar's complete samples before the damage instead of raising
            (``on_error: skip``): the index goes to ``cache_dir`` and its notes say what was lost
            (:func:`left_out`).
        name: the shard's name in messages, warnings and the damage recorded in the index's notes, when
            it is not ``shard``: a cached copy of a remote shard is named by its URL, so that a sample its
            damage cut is reported against the URL the user gave, not the cache file.

    Raises:
        ShardError: the shard is missing, unreadable, compressed, or (without ``salvage``) empty or
            damaged: truncated, cut, corrupt; names the shard and the byte offset. With ``salvage`` an
            empty shard is indexed as a damaged one with no sample (a warning; :func:`left_out` names it). An index made
            with ``salvage`` raises the same error when read without it.
    """
    shown = os.fspath(shard) if name is None else name
    if not os.path.isfile(shard):
        what = "is not a file" if os.path.exists(shard) else "not found"
        raise ShardError(f"shard {what}: {shown!r}")
    for candidate in index_candidates(shard, cache_dir):
        found = checked_index(shard, candidate)
        if isinstance(found, tuple):
            samples, notes = found
            if notes.damaged and not salvage:
                raise ShardError(notes.damaged)
            if notes.repeated:
                warn_once(repeated_message(shown, list(notes.repeated)), RepeatedKeyWarning, stacklevel=2)
            return candidate, samples
        if found is not None:
            warnings.warn(f"the index {str(candidate)!r} does not describe shard {shown!r} ({found}); "
                          "indexing the shard again", stacklevel=2)
    scanned = salvage_tar(shard, name=name) if salvage else None
    if scanned is not None and scanned.damage is None and not scanned.samples and not scanned.repeated:
        empty = f"shard holds no samples: {shown!r}"  # under skip a skipped shard, counted (key '?'), as damage is
        warnings.warn(f"{empty}; skipping it (on_error: skip)", stacklevel=2)
        return write_index(shard, cached_index_path(shard, cache_dir), [], IndexNotes(0, damaged=empty)), []
    if scanned is None or scanned.damage is None:
        samples, repeated = split_duplicates(scan_tar(shard, keep_duplicates=True, name=name))
        notes = IndexNotes(len(samples), repeated=tuple(s.key for s in repeated))
    else:
        samples = scanned.samples
        notes = IndexNotes(len(samples), repeated=scanned.repeated, damaged=scanned.damage.message, lost=scanned.lost)
        warnings.warn(f"{scanned.damage.message}; reading its {len(samples)} complete sample(s) before the damage "
                      "and skipping the rest (on_error: skip)", stacklevel=2)
        return write_index(shard, cached_index_path(shard, cache_dir), samples, notes), samples
    if notes.repeated:
        warn_once(repeated_message(shown, list(notes.repeated)), RepeatedKeyWarning, stacklevel=2)
    beside = default_index_path(shard)
    if os.access(beside.parent, os.W_OK):
        try:
            return write_index(shard, beside, samples, notes), samples
        except OSError as exc:  # e.g. a read-only mount that reports W_OK
            warnings.warn(f"cannot write index next to {beside.parent}: {exc}; using the cache", stacklevel=2)
    return write_index(shard, cached_index_path(shard, cache_dir), samples, notes), samples

def left_out(index: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(key, reason) of the shard's samples its index leaves out: repeated keys, and the samples a damaged
    tar's damage cut (see :class:`~feedfast.shards.index.notes.IndexNotes`); [] for an unreadable index."""
    try:
        with open(index, "rb") as f:
            first = f.readline().decode("utf-8")
        return parse_header(first.rstrip("\r\n"), INDEX_VERSION).left_out()
    except (OSError, UnicodeDecodeError, ValueError):
        return []
