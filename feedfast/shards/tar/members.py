"""A shard's members and samples, as its index lists them, and how members make samples.

A sample is a run of consecutive members sharing a key: the member name up to the first dot
of its base name (WebDataset's rule, :func:`split_name`). A key that comes back later, or a
member name that comes back within one key's run (two adjacent copies of a sample), starts a
repeated sample (:func:`group_members`, :func:`split_duplicates`).
"""

from __future__ import annotations

import gc
import tarfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


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

    Every member makes part of a sample: ``dir/.jpg`` is the sample ``dir/``, as WebDataset reads
    it, and ``.jpg`` at the root the sample of the empty key (WebDataset drops it without a word;
    here it is delivered, and named ``''``).
    """
    samples: list[Sample] = []
    current: list[Member] = []
    names: set[str] = set()
    for m in members:
        if current and (current[0].key != m.key or m.name in names):  # a name seen in the run: another copy
            samples.append(new_sample(current[0].key, tuple(current)))
            current = []
            names.clear()
        current.append(m)
        names.add(m.name)
    if current:
        samples.append(new_sample(current[0].key, tuple(current)))
    return samples if keep_duplicates else split_duplicates(samples)[0]

def new_member(key: str, ext: str, offset: int, size: int, name: str) -> Member:
    """``Member(key, ext, offset, size, name)``, three times faster: a frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``; here they go into the instance's dict at once
    (the same object: equal, same hash and repr). Indexes make hundreds of thousands of them."""
    m = _new(Member)
    fields = m.__dict__
    fields["key"], fields["ext"], fields["offset"], fields["size"], fields["name"] = key, ext, offset, size, name
    return m

def new_sample(key: str, members: tuple[Member, ...]) -> Sample:
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

def first_member(sample: Sample, exts: set[str] | frozenset[str]) -> Member | None:
    """The sample's first member in tar order whose extension is in ``exts`` (any case), as DALI picks it."""
    for m in sample.members:  # a loop, not next() over a generator: this runs for every sample opened
        if m.ext.lower() in exts:
            return m
    return None

def data_end(samples: list[Sample]) -> int:
    """The byte just past the last member's data (0 for no samples): a shard must be at least this long."""
    return max((m.offset + m.size for s in samples for m in s.members), default=0)
