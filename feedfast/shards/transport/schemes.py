"""The one registry of shard transports: the URL schemes feedfast reads and what each transport can do.

Everything that asks "what kind of shard name is this" asks here: :func:`url_kind` (and so
the shard lists' remote entries, :data:`REMOTE_PREFIXES`), which the rescue of a failed DALI batch
can read again (:data:`RESCUABLE_KINDS`). A name with a scheme (``xyz://``) that no transport
declares is refused, naming the scheme and the supported ones. Every backend reads every kind
itself (DALI through feedfast's feed: DALI's own reader and its s3/gs clients are not used).

=========  ====================  ======  =======  ======  ==========================================
kind       names                 ranged  samples  rescue  read
=========  ====================  ======  =======  ======  ==========================================
``file``   paths, ``file://``    yes     yes      yes     ``pread``; mapped by DALI's feed (:mod:`.shardfiles`)
``http``   ``http(s)://``        yes     no       yes     feedfast's ranged reader (:mod:`.remote`)
``s3``     ``s3://``             yes     no       yes     signed GETs (:mod:`.s3http`), else fsspec
``gs``     ``gs://``             yes     no       yes     fsspec
``pipe``   ``pipe:CMD``          no      no       no      the command's stdout, into the cache
``cache``  (a read kind)         yes     yes      yes     the shard cache (:mod:`.cache`)
=========  ====================  ======  =======  ======  ==========================================

``ranged``: bytes can be read at an offset. ``samples``: a sample-sized read is cheap enough
that the CPU paths read a shuffled epoch sample by sample, in the global order
(:func:`~feedfast.order.deal.partition_for`): a local file or a downloaded one. A
request per sample is not: on 127.0.0.1 (2 cores, ``benchmarks/remote.py``) feedfast's http
reader costs about 0.3 ms of CPU a sample-sized request, and the server as much again, so the
threaded path ran at 0.66 of its local rate over http in the global order and at 0.9 to 1.0
of it reading windows (the block shuffle); http, s3 and gs shards are read a window of
consecutive samples at a time. ``rescue``: the stream reader can read a step again to find the sample DALI
failed on. ``cached``: the shard is only read after a whole download into the shard cache
(its source has no ranges). ``cache`` names no scheme: it is how a downloaded shard is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from feedfast.errors import ShardError

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class Kind:
    """What one transport reads and can do.

    Attributes:
        name: the kind (``ShardSet.kinds`` holds it): ``file``, ``http``, ``s3``, ``gs``, ``pipe``, ``cache``.
        prefixes: the name prefixes it serves (``http://``); none for ``cache``, and local paths are ``file``.
        ranged: bytes can be read at an offset.
        rescue: the stream reader can read its samples again (the rescue of a failed DALI batch).
        cached: read only through the shard cache, downloaded whole first.
        sample_reads: a sample-sized ranged read is cheap enough to read a shuffled epoch sample by sample.
    """

    name: str
    prefixes: tuple[str, ...]
    ranged: bool
    rescue: bool
    cached: bool = False
    sample_reads: bool = False


FILE = Kind("file", ("file://",), ranged=True, rescue=True, sample_reads=True)
HTTP = Kind("http", ("http://", "https://"), ranged=True, rescue=True)
S3 = Kind("s3", ("s3://",), ranged=True, rescue=True)
GS = Kind("gs", ("gs://",), ranged=True, rescue=True)
PIPE = Kind("pipe", ("pipe:",), ranged=False, rescue=False, cached=True)
CACHE = Kind("cache", (), ranged=True, rescue=True, sample_reads=True)

KINDS: dict[str, Kind] = {k.name: k for k in (FILE, HTTP, S3, GS, PIPE, CACHE)}
_BY_PREFIX = [(p, k) for k in KINDS.values() for p in k.prefixes]

REMOTE_PREFIXES = tuple(p for p, k in _BY_PREFIX if k is not FILE)
"""The prefixes of names that are not local files (``file://`` names a local path)."""
RESCUABLE_KINDS = tuple(k.name for k in KINDS.values() if k.rescue)
"""Kinds the stream reader can read again to find a sample DALI failed on."""


def supported() -> str:
    """The names feedfast reads, for messages: ``local paths, file://, http://, ...``."""
    return ", ".join(["local paths"] + [f"{p}CMD" if p.endswith(":") else p for p, _ in _BY_PREFIX])


def url_kind(url: str) -> str:
    """The kind of a shard name: ``file`` (a local path), ``http``, ``s3``, ``gs`` or ``pipe``.

    Raises:
        ShardError: the name starts with a scheme (``xyz://``) that no transport reads; names it
            and the supported ones.
    """
    for prefix, kind in _BY_PREFIX:
        if url.startswith(prefix):
            return kind.name
    found = _SCHEME.match(url)
    if found:
        raise ShardError(f"unsupported shard URL {url[:200]!r}: no transport reads the scheme {found.group(1)!r}; "
                         f"feedfast reads {supported()}")
    return FILE.name


def kind(name: str) -> Kind:
    """The declaration of a read kind (``ShardSet.kinds``' values).

    Raises:
        ShardError: no transport declares that kind.
    """
    found = KINDS.get(name)
    if found is None:
        raise ShardError(f"unknown shard kind {name!r}; the kinds are {', '.join(KINDS)}")
    return found
