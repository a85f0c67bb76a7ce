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
(``feedfast shards inspect`` lists them too), so no sample is delivered twice. An index lives next to its shard
(``train-0000.tar`` -> ``train-0000.idx``) when that folder is writable, otherwise in
feedfast's cache folder under a name derived from the shard's path, size and mtime. It is
reused while it is newer than the shard and its last member still fits inside the shard.
"""

from __future__ import annotations

import gc
import hashlib
import os
import tarfile
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from feedfast.errors import ShardError
from feedfast.sources.tarscan import scan_members

INDEX_VERSION = "v1.2"


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
        ShardError: the file is missing, unreadable, not a tar, truncated (also when it ends
            without an end-of-archive block: cut at a member boundary), corrupt, or holds a
            GNU sparse member.
    """
    path = os.fspath(path)
    members = []
    with collector_paused():
        for name, offset, size in scan_members(path):
            key, ext = split_name(name)
            members.append(_member(key, ext, offset, size, name))
        samples = group_members(members, keep_duplicates=True)
    if keep_duplicates:
        return samples
    unique, repeated = split_duplicates(samples)
    if repeated:
        keys = sorted({s.key for s in repeated})
        warnings.warn(f"shard {path!r}: {len(repeated)} sample(s) repeat a key seen earlier in the shard "
                      f"({', '.join(map(repr, keys[:5]))}{', ...' if len(keys) > 5 else ''}); only the first "
                      "sample of each key is read", stacklevel=2)
    return unique


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

    A key that comes back after another key's members is a duplicate: only its first
    sample is kept, unless ``keep_duplicates``.
    """
    samples: list[Sample] = []
    current: list[Member] = []
    for m in members:
        if not m.key or m.key.endswith("/"):
            continue
        if current and current[0].key != m.key:
            samples.append(_sample(current[0].key, tuple(current)))
            current = []
        current.append(m)
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


def escape_name(name: str) -> str:
    """A member name with the index format's separators %-escaped (``%``, space, newline)."""
    return name.replace("%", "%25").replace(" ", "%20").replace("\n", "%0A")


def unescape_name(name: str) -> str:
    """The inverse of :func:`escape_name`."""
    return name.replace("%20", " ").replace("%0A", "\n").replace("%25", "%")


def format_index(samples: list[Sample]) -> str:
    """Render samples as a DALI ``v1.2`` index (whitespace in names is %-escaped)."""
    lines = [f"{INDEX_VERSION} {len(samples)}"]
    for s in samples:
        fields = []
        for m in s.members:
            name = escape_name(m.name)
            ext = m.ext.replace(" ", "_")
            fields.append(f"{ext} {m.offset} {m.size} {name}")
        lines.append(" ".join(fields))
    return "\n".join(lines) + "\n"


def parse_index(text: str) -> list[Sample]:
    """Parse a ``v1.2`` index back into samples (the inverse of :func:`format_index`)."""
    rows = text.splitlines()
    if not rows or not rows[0].startswith(INDEX_VERSION + " "):
        raise ShardError(f"not a {INDEX_VERSION} webdataset index")
    with collector_paused():
        return _parse_rows(rows)


def _parse_rows(rows: list[str]) -> list[Sample]:
    samples = []
    for row in rows[1:]:
        f = row.split(" ")
        members = []
        for i in range(0, len(f) - 3, 4):
            name = f[i + 3]
            if "%" in name:
                name = unescape_name(name)
            slash = name.rfind("/") + 1
            dot = name.find(".", slash)
            members.append(_member(name if dot < 0 else name[:dot], f[i], int(f[i + 1]), int(f[i + 2]), name))
        if members:
            samples.append(_sample(members[0].key, tuple(members)))
    return samples


def default_index_path(shard: str | os.PathLike[str]) -> Path:
    """Where the index of a local shard lives when its folder is writable."""
    p = Path(shard)
    stem = p.name[: -len(".tar")] if p.name.endswith(".tar") else p.name
    return p.with_name(stem + ".idx")


def shard_digest(shard: str | os.PathLike[str], *extra: object) -> str:
    """A short hash of a local shard's identity (path, size, mtime) and ``extra``: a cache key."""
    st = os.stat(shard)
    text = "|".join(map(str, (os.path.abspath(shard), st.st_size, st.st_mtime_ns, *extra)))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def cached_index_path(shard: str | os.PathLike[str], cache_dir: Path) -> Path:
    """The cache-folder location of a shard's index, keyed by path, size and mtime."""
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


def read_index(path: str | os.PathLike[str], shard: str, expect: int | None = None) -> list[Sample]:
    """The samples of an index file that describes ``shard``.

    Raises:
        ShardError: the index cannot be read, or no longer lists ``expect`` samples (the
            shard changed since it was opened).
    """
    try:
        samples = parse_index(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
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
    """The samples of an existing index that still describes the shard, else None.

    Fresh means: the index is at least as new as the shard and its last member still
    fits inside the shard.
    """
    try:
        ist, sst = index.stat(), os.stat(shard)
    except OSError:
        return None
    if ist.st_mtime_ns < sst.st_mtime_ns:
        return None
    try:
        samples = parse_index(index.read_text(encoding="utf-8"))
    except (ShardError, ValueError, UnicodeDecodeError, OSError):
        return None
    return samples if samples and data_end(samples) <= sst.st_size else None


def write_index(shard: str | os.PathLike[str], index: Path, samples: list[Sample] | None = None) -> Path:
    """Scan ``shard`` (unless ``samples`` are given) and write its index atomically."""
    samples = scan_tar(shard) if samples is None else samples
    if not samples:
        raise ShardError(f"shard holds no samples: {os.fspath(shard)!r}")
    return write_atomic(index, format_index(samples))


def load_index(shard: str | os.PathLike[str], cache_dir: Path) -> tuple[Path, list[Sample]]:
    """Return a fresh index of a local shard and its samples, building it if needed.

    Looks next to the shard, then in ``cache_dir``; builds next to the shard when that
    folder is writable, else in ``cache_dir``.

    Raises:
        ShardError: the shard is missing, unreadable, not a tar, truncated or empty.
    """
    if not os.path.isfile(shard):
        what = "is not a file" if os.path.exists(shard) else "not found"
        raise ShardError(f"shard {what}: {os.fspath(shard)!r}")
    for candidate in (default_index_path(shard), cached_index_path(shard, cache_dir)):
        samples = fresh_samples(shard, candidate)
        if samples is not None:
            return candidate, samples
    samples = scan_tar(shard)
    beside = default_index_path(shard)
    if os.access(beside.parent, os.W_OK):
        try:
            return write_index(shard, beside, samples), samples
        except OSError as exc:  # e.g. a read-only mount that reports W_OK
            warnings.warn(f"cannot write index next to {beside.parent}: {exc}; using the cache", stacklevel=2)
    return write_index(shard, cached_index_path(shard, cache_dir), samples), samples
