"""Tar indexes for DALI's webdataset reader, built in Python and safe for PAX tars.

DALI's own tar parser misreads PAX and GNU long-name members (empty components, DALI
issues #3640 and #5440). Python's :mod:`tarfile` reads those headers correctly, and
:mod:`feedfast.sources.tarscan` reads them as tarfile does, faster, so feedfast writes the
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

import gc
import hashlib
import os
import re
import tarfile
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

from feedfast.errors import ShardError
from feedfast.sources.indexcheck import check_against_tar, check_bounds, shard_fingerprint
from feedfast.sources.indexnotes import IndexNotes, parse_header
from feedfast.sources.tarscan import Damage, salvage_members, scan_members

INDEX_VERSION = "v1.2"


class RepeatedKeyWarning(UserWarning):
    """A shard holds a key more than once: only its first sample is read."""


@dataclass(frozen=True)
class Member:
    """One regular file inside a tar: its sample key, extension, data offset and size."""

    key: str
    ext: str
    offset: int
    size: int
    name: str


@dataclass(frozen=True)
class Sample:
    """One sample of a shard: its key and its components in tar order."""

    key: str
    members: tuple[Member, ...]

    @property
    def exts(self) -> tuple[str, ...]:
        """The component extensions of this sample, in tar order."""
        return tuple(m.ext for m in self.members)


def split_name(name: str) -> tuple[str, str]:
    """Split a member name into (key, extension) at the first dot of its base name.

    >>> split_name("a/b.c/n01440764_10026.seg.png")
    ('a/b.c/n01440764_10026', 'seg.png')
    """
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


def scan_tar(path: str | os.PathLike[str], *, keep_duplicates: bool = False) -> list[Sample]:
    """Read a tar's headers and group its regular files into samples.

    The headers are read by :func:`feedfast.sources.tarscan.scan_members`: what :mod:`tarfile`
    reads, faster, and stricter about damage.

    Args:
        path: a local tar file.
        keep_duplicates: keep every sample of a repeated key (for inspection); by default
            only the first is kept and the rest are named in a warning.

    Returns:
        The samples in tar order.

    Raises:
        ShardError: the file is missing, unreadable, compressed, not a tar, truncated (also when it
            ends without an end-of-archive block: cut at a member boundary), corrupt, or holds a
            GNU sparse member.
    """
    path = os.fspath(path)
    samples = _grouped(scan_members(path))
    if keep_duplicates:
        return samples
    unique, repeated = split_duplicates(samples)
    if repeated:
        warn_once(repeated_message(path, [s.key for s in repeated]), RepeatedKeyWarning, stacklevel=3)
    return unique


@dataclass(frozen=True)
class Scanned:
    """A tar read as far as it can be: its samples (the first of each key), what was left out, the damage."""

    samples: list[Sample]
    repeated: tuple[str, ...] = ()
    damage: Damage | None = None
    lost: tuple[str, ...] = ()


def salvage_tar(path: str | os.PathLike[str]) -> Scanned:
    """The samples of a tar, or of a damaged tar those wholly before the damage, with what is lost.

    A sample is lost with the damage when the damaged member is one of its own, or when the
    damage gives no name (the file is cut, or garbage stands where a header should be) and the
    sample, the last before it, lacks a component the sample before it has (its other members may
    have been cut off). The samples after the damage cannot be read at all.

    Raises:
        ShardError: the file is missing, unreadable, compressed or holds a sparse member.
    """
    path = os.fspath(path)
    found, damage = salvage_members(path)
    samples, repeated = split_duplicates(_grouped(found))
    lost: tuple[str, ...] = ()
    if damage is not None and samples:
        last = samples[-1]
        if damage.member is not None:
            cut = split_name(damage.member)[0] == last.key
        else:
            cut = len(samples) < 2 or not set(samples[-2].exts) <= set(last.exts)
        if cut:
            samples, lost = samples[:-1], (last.key,)
    return Scanned(samples, tuple(s.key for s in repeated), damage, lost)


def _grouped(found: list[tuple[str, int, int]]) -> list[Sample]:
    members = []
    with collector_paused():
        for name, offset, size in found:
            key, ext = split_name(name)
            members.append(_member(key, ext, offset, size, name))
        return group_members(members, keep_duplicates=True)


def repeated_message(path: str, keys: list[str]) -> str:
    """The warning naming a shard's repeated keys (the same words wherever it is raised)."""
    distinct = sorted(set(keys))
    return (f"shard {path!r}: {len(keys)} sample(s) repeat a key seen earlier in the shard "
            f"({', '.join(map(repr, distinct[:5]))}{', ...' if len(distinct) > 5 else ''}); only the first "
            "sample of each key is read")


_WARNED: set[str] = set()


def warn_once(message: str, category: type[Warning] = UserWarning, stacklevel: int = 2) -> None:
    """Warn with ``message`` the first time this process meets it (a shard indexed in a worker and then
    opened here would otherwise warn twice)."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, category, stacklevel=stacklevel + 1)


def forget_warning(message: str) -> None:
    """Let :func:`warn_once` raise ``message`` again (it was caught, not shown)."""
    _WARNED.discard(message)


def split_duplicates(samples: list[Sample]) -> tuple[list[Sample], list[Sample]]:
    """(the first sample of each key, the later samples that repeat a key), both in tar order."""
    seen: set[str] = set()
    unique: list[Sample] = []
    repeated: list[Sample] = []
    for s in samples:
        (repeated if s.key in seen else unique).append(s)
        seen.add(s.key)
    return unique, repeated


def member_of(info: tarfile.TarInfo) -> Member:
    """The index entry of a tar member (its data offset, not its header's)."""
    key, ext = split_name(info.name)
    return Member(key=key, ext=ext, offset=info.offset_data, size=info.size, name=info.name)


def group_members(members: list[Member], *, keep_duplicates: bool = False) -> list[Sample]:
    """Group consecutive members sharing a key into samples (WebDataset's rule).

    A key that comes back after another key's members is a duplicate, and so is a run of one
    key's members in which a member name comes back (``a.jpg a.cls a.jpg a.cls``: the second
    ``a.jpg`` starts a second sample of ``a``): only its first sample is kept, unless
    ``keep_duplicates``.
    """
    samples: list[Sample] = []
    current: list[Member] = []
    names: set[str] = set()
    for m in members:
        if not m.key or m.key.endswith("/"):
            continue
        if current and (current[0].key != m.key or m.name in names):  # a name seen in the run: another copy
            samples.append(_sample(current[0].key, tuple(current)))
            current = []
            names.clear()
        current.append(m)
        names.add(m.name)
    if current:
        samples.append(_sample(current[0].key, tuple(current)))
    return samples if keep_duplicates else split_duplicates(samples)[0]


def _member(key: str, ext: str, offset: int, size: int, name: str) -> Member:
    """``Member(key, ext, offset, size, name)``, three times faster: a frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``; here they go into the instance's dict at once
    (the same object: equal, same hash and repr). Indexes make hundreds of thousands of them."""
    m = _new(Member)
    fields = m.__dict__
    fields["key"], fields["ext"], fields["offset"], fields["size"], fields["name"] = key, ext, offset, size, name
    return m


def _sample(key: str, members: tuple[Member, ...]) -> Sample:
    """``Sample(key, members)``, made as :func:`_member` makes a Member."""
    s = _new(Sample)
    fields = s.__dict__
    fields["key"], fields["members"] = key, members
    return s


_new = object.__new__


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while many small objects are made (Members and Samples
    hold no cycles). Left on, it runs every 700 new objects and, as they pile up, walks all of them again:
    parsing 256 indexes of 1,251 samples while keeping them took 4.1 s of CPU with it, 1.3 s without."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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
                members.append(_member(name if dot < 0 else name[:dot], ext, int(f[i + 1]), int(f[i + 2]), name))
        except ValueError as exc:
            raise ShardError(f"line {number + 1} of the index is damaged: {exc}") from None
        samples.append(_sample(members[0].key, tuple(members)))
    return samples


def default_index_path(shard: str | os.PathLike[str]) -> Path:
    """Where the index of a local shard lives when its folder is writable."""
    p = Path(shard)
    stem = p.name[: -len(".tar")] if p.name.endswith(".tar") else p.name
    return p.with_name(stem + ".idx")


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


def data_end(samples: list[Sample]) -> int:
    """The byte just past the last member's data (0 for no samples): a shard must be at least this long."""
    return max((m.offset + m.size for s in samples for m in s.members), default=0)


def first_member(sample: Sample, exts: set[str] | frozenset[str]) -> Member | None:
    """The sample's first member in tar order whose extension is in ``exts`` (any case), as DALI picks it."""
    for m in sample.members:  # a loop, not next() over a generator: this runs for every sample opened
        if m.ext.lower() in exts:
            return m
    return None


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file renamed into place (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_text(path: str | os.PathLike[str]) -> str:
    """An index file's text as written (no newline translation: ``\\r`` is not a line end)."""
    return Path(path).read_bytes().decode("utf-8")


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
            check_bounds(shard, [(m.name, m.offset, m.size) for s in samples for m in s.members], os.path.getsize(shard))
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
    lists no key twice, and every member's offset follows that member's header in the tar
    (:func:`~feedfast.sources.indexcheck.check_against_tar`).
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
        if notes.fingerprint and notes.fingerprint != shard_fingerprint(shard, sst.st_size):
            return ("the shard's content fingerprint differs from the one recorded with the index: the shard was "
                    "rewritten since it was indexed")
        if not samples and not notes.damaged:
            return "it lists no sample"
        _, repeated = split_duplicates(group_members([m for s in samples for m in s.members], keep_duplicates=True))
        if repeated:
            return f"it lists key {repeated[0].key!r} twice"
        check_against_tar(shard, [(m.name, m.offset, m.size) for s in samples for m in s.members])
    except (ShardError, OSError) as exc:
        return str(exc)
    return samples, notes


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


def load_index(shard: str | os.PathLike[str], cache_dir: Path, *, salvage: bool = False) -> tuple[Path, list[Sample]]:
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

    Raises:
        ShardError: the shard is missing, unreadable, compressed, empty, or (without ``salvage``)
            damaged: truncated, cut, corrupt; names the shard and the byte offset. An index made
            with ``salvage`` raises the same error when read without it.
    """
    if not os.path.isfile(shard):
        what = "is not a file" if os.path.exists(shard) else "not found"
        raise ShardError(f"shard {what}: {os.fspath(shard)!r}")
    for candidate in (default_index_path(shard), cached_index_path(shard, cache_dir)):
        found = checked_index(shard, candidate)
        if isinstance(found, tuple):
            samples, notes = found
            if notes.damaged and not salvage:
                raise ShardError(notes.damaged)
            if notes.repeated:
                warn_once(repeated_message(os.fspath(shard), list(notes.repeated)), RepeatedKeyWarning, stacklevel=2)
            return candidate, samples
        if found is not None:
            warnings.warn(f"the index {str(candidate)!r} does not describe shard {os.fspath(shard)!r} ({found}); "
                          "indexing the shard again", stacklevel=2)
    scanned = salvage_tar(shard) if salvage else None
    if scanned is None or scanned.damage is None:
        samples, repeated = split_duplicates(scan_tar(shard, keep_duplicates=True))
        notes = IndexNotes(len(samples), repeated=tuple(s.key for s in repeated))
    else:
        samples = scanned.samples
        notes = IndexNotes(len(samples), repeated=scanned.repeated, damaged=scanned.damage.message, lost=scanned.lost)
        warnings.warn(f"{scanned.damage.message}; reading its {len(samples)} complete sample(s) before the damage "
                      "and skipping the rest (on_error: skip)", stacklevel=2)
        return write_index(shard, cached_index_path(shard, cache_dir), samples, notes), samples
    if notes.repeated:
        warn_once(repeated_message(os.fspath(shard), list(notes.repeated)), RepeatedKeyWarning, stacklevel=2)
    beside = default_index_path(shard)
    if os.access(beside.parent, os.W_OK):
        try:
            return write_index(shard, beside, samples, notes), samples
        except OSError as exc:  # e.g. a read-only mount that reports W_OK
            warnings.warn(f"cannot write index next to {beside.parent}: {exc}; using the cache", stacklevel=2)
    return write_index(shard, cached_index_path(shard, cache_dir), samples, notes), samples


def left_out(index: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(key, reason) of the shard's samples its index leaves out: repeated keys, and the samples a damaged
    tar's damage cut (see :class:`~feedfast.sources.indexnotes.IndexNotes`); [] for an unreadable index."""
    try:
        with open(index, "rb") as f:
            first = f.readline().decode("utf-8")
        return parse_header(first.rstrip("\r\n"), INDEX_VERSION).left_out()
    except (OSError, UnicodeDecodeError, ValueError):
        return []
