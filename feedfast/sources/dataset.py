"""A dataset of shards: resolved paths or URLs, indexes and per-shard sample counts.

How each shard's bytes are read (``ShardSet.kinds``) decides the transport:

- local paths and ``file://`` URLs: ``file``; indexed next to the shard or in the cache
  (:mod:`.index`); images checked;
- ``pipe:CMD``: ``cache``; downloaded whole into the shard cache (:mod:`.cache`), indexed
  and checked there;
- ``http(s)://``: ``http``; index from ``<name>.idx`` beside the shard, else one scan
  (:mod:`.remote_index`); images not checked (see below);
- ``s3://``, ``gs://``: ``s3``, ``gs``; indexed as http, through fsspec; not checked.

Every backend reads the shards itself, whatever their kind (on DALI through feedfast's feed,
:mod:`feedfast.loader.backends.dali.stream`; a shuffled epoch over remote shards in the block shuffle,
:func:`~feedfast.order.deal.partition_for`).
One dataset may hold shards of any kinds together. Images in remote shards
are not checked under ``on_error: raise`` (a header check would cost a request per image: a
bad image fails its batch instead); under ``on_error: skip`` http, s3 and gs shards are
cached whole through their transport (:mod:`.cache`) and checked there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from feedfast import _env
from feedfast.checks import labels as labelchecks
from feedfast.checks.checked import CHECK_RULES, SHARDS_AT_ONCE, check_shards
from feedfast.checks.validate import DEFAULT_MAX_PIXELS
from feedfast.errors import SampleError, ShardError
from feedfast.order.block import BlockShuffle
from feedfast.shards.index import snapshot
from feedfast.shards.index.columnar import ColumnarIndex, dataset_index
from feedfast.shards.index.indexing import prepare_indexes
from feedfast.shards.index.remote import remote_index, unfetched_index
from feedfast.shards.index.tarindex import Sample, first_member, left_out, load_index, subset_index
from feedfast.shards.transport.cache import ShardCache
from feedfast.shards.transport.remote import DEFAULT_TRANSFER, NOT_THERE, RemoteError, Transfer, url_kind
from feedfast.sources.members import ShardMembers
from feedfast.sources.shardlist import resolve_shards
from feedfast.spec.model import Spec


@dataclass(frozen=True)
class ShardSet:
    """Shards with the indexes DALI reads, and the samples each one contributes.

    Attributes:
        paths: shard paths or URLs (a side shard of re-encoded images follows its source shard).
        index_paths: the matching DALI index files (filtered when samples were left out).
        sizes: samples DALI reads from each shard.
        skipped: samples left out, as (shard, key, reason): missing components under
            ``missing: skip``, repeated keys, undecodable images, refused labels, JSON or ``.npy``
            components (:mod:`.labelchecks`) and the samples a damaged tar cut (key ``?``: those
            after the damage) under ``on_error: skip``.
        converted: samples re-encoded into side shards, as (shard, key, reason).
        raw_bytes: total size of the given shard files (of remote ones when known).
        kinds: how each shard is read: ``file``, ``http``, ``cache`` (a cached ``pipe:``
            or http shard), ``s3``, ``gs``; empty means all ``file``.
        cache: the shard cache that ``cache`` shards are read from.
        transfer: timeout and retries for remote reads.
        shuffle: the block shuffle's sizes when epochs are shuffled (the spec's ``shuffle``
            section), None when they are not; remote shards are read in that order.
        cache_dir: feedfast's cache folder, where the dataset's columnar index lives
            (:mod:`.columnar`); empty: the default one.
    """

    paths: tuple[str, ...]
    index_paths: tuple[str, ...]
    sizes: tuple[int, ...]
    skipped: tuple[tuple[str, str, str], ...] = ()
    converted: tuple[tuple[str, str, str], ...] = ()
    raw_bytes: int = 0
    kinds: tuple[str, ...] = ()
    cache: ShardCache | None = None
    transfer: Transfer = DEFAULT_TRANSFER
    shuffle: BlockShuffle | None = None
    cache_dir: str = ""

    @property
    def read_kinds(self) -> tuple[str, ...]:
        """How each shard is read (``kinds``, with ``file`` filled in)."""
        return self.kinds or ("file",) * len(self.paths)

    @property
    def total(self) -> int:
        """Samples DALI reads over all shards."""
        return sum(self.sizes)

    @property
    def bytes(self) -> int:
        """Total size of the given shard files."""
        return self.raw_bytes

    # what every dataset answers (a folder read in place too, :class:`~feedfast.sources.folder.FolderSet`)
    source_kind = "shards"
    """What kind of dataset it is; a backend declares the kinds it reads (``Backend.sources``)."""
    class_names: tuple[str, ...] = ()
    """Class names in label order: shards carry none."""

    @property
    def checks_when_read(self) -> bool:
        """False: images were checked when the shards were opened; a sample failing later is an error."""
        return False

    @property
    def identity(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """What a loader state must match: the shards in order and the samples each contributes."""
        return self.paths, self.sizes

    def row_index(self, exts: Sequence[set[str] | frozenset[str]]) -> ColumnarIndex:
        """The dataset's columnar index of these components (each one's extensions), built once and cached."""
        return dataset_index(self.paths, self.index_paths, self.sizes, exts, Path(self.cache_dir or _env.cache_dir()))

    def members(self, exts: Sequence[set[str] | frozenset[str]]) -> ShardMembers:
        """The reader of local shards' members at their index's offsets."""
        return ShardMembers(self.paths)


def _exts(ext: str) -> set[str]:
    return {e.lower() for e in ext.split(";")}


def _complete(path: str, samples: list[Sample], spec: Spec, skipped: list[tuple[str, str, str]]) -> list[Sample]:
    """The samples that have every component, applying ``missing``."""
    kept = []
    for s in samples:
        lacking = [c.name for c in spec.components.values() if first_member(s, _exts(c.ext)) is None]
        if not lacking or spec.missing == "empty":
            kept.append(s)
        elif spec.missing == "skip":
            skipped.append((path, s.key, f"missing component(s) {', '.join(lacking)}"))
        else:
            raise SampleError("sample lacks a component (source.missing is `error`)", shard=path, key=s.key,
                              reason=f"no member for {', '.join(lacking)}; has {', '.join(s.exts) or 'nothing'}; "
                              "set `source: {missing: skip}` to leave such samples out")
    return kept


@dataclass(frozen=True)
class Located:
    """One given shard, found and indexed: how it is read, its index, a local copy if any, its size."""

    kind: str
    index: Path
    samples: list[Sample]
    local: str | None
    nbytes: int


def locate(name: str, cache_dir: Path, cache: ShardCache, *, check_locally: bool) -> Located:
    """Index one shard; cache it whole when it is a ``pipe:`` shard or must be checked locally.

    A remote shard checked locally (``on_error: skip``) is downloaded through its scheme's
    transport into the shard cache, and read from there: http, s3 and gs alike.

    Raises:
        ShardError: the shard cannot be read or indexed; names it.
    """
    kind = url_kind(name)
    if kind == "file":  # checked locally (on_error: skip): a damaged tar's samples before the damage are read
        idx, samples = load_index(name, cache_dir, salvage=check_locally)
        return Located("file", idx, samples, name, os.path.getsize(name))
    if kind == "pipe" or check_locally:
        try:
            path = cache.ensure(name)
        except RemoteError as exc:  # retried already; under skip its loss is listed (key '?'), not fatal,
            if not check_locally or exc.status in NOT_THERE:  # unless the shard is not there at all
                raise
            return Located("cache", unfetched_index(name, cache_dir, exc), [], None, 0)
        try:  # under skip, a damaged download's samples before the damage are read, as a local shard's; the
            # damage's reason, and every message, names the URL the user gave (the cached copy named beside it)
            idx, samples = load_index(path, cache_dir, salvage=check_locally, name=name)
        except ShardError as exc:
            raise ShardError(f"{exc} (shard cached as {str(path)!r})") from exc
        return Located("cache", idx, samples, str(path), path.stat().st_size)
    idx, samples, size = remote_index(name, cache_dir, cache.transfer)
    return Located(kind, idx, samples, None, size)


def _record_name(resolved: list[str], spec: Spec, policy: str, max_pixels: int) -> str | None:
    """The name of the record of opening these shards with these settings (:mod:`.snapshot`); None
    when any shard is remote (remote shards are not recorded)."""
    if any(url_kind(p) != "file" for p in resolved):
        return None
    settings = {"components": [[c.name, c.ext, c.kind] for c in spec.components.values()], "missing": spec.missing,
                "on_error": policy, "max_pixels": max_pixels, "check_seconds": spec.check_seconds,
                "check_rules": CHECK_RULES, "label_checks": labelchecks.rules(labelchecks.host_fields(spec))}
    return snapshot.digest(resolved, settings)


def open_shards(shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], spec: Spec,
                cache_dir: Path, *, on_error: str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS,
                cache_limit: int | None = None, transfer: Transfer = DEFAULT_TRANSFER) -> ShardSet:
    """Resolve, index, check and count shards for a spec.

    Samples lacking a component are an error naming the shard and key under
    ``missing: error``, are left out and listed under ``missing: skip``, and count under
    ``missing: empty`` (the component arrives empty). Image components are checked once
    and the verdicts cached (see :mod:`feedfast.checks.validate`): headers only under
    ``on_error: raise``, a full decode under ``on_error: skip``. DALI is given a
    filtered index whenever samples are left out, so it never reads them. Under ``on_error: skip``
    the fields made on the host (labels, JSON, ``.npy``) are run once per sample too, and the
    samples they refuse are left out and listed (:mod:`.labelchecks`). Remote shards
    are indexed as the module docstring says; ``cache_limit`` bounds the shard cache
    (bytes, None: unlimited) and ``transfer`` sets remote timeouts and retries.
    """
    policy = on_error or spec.on_error
    image_exts = [_exts(c.ext) for c in spec.components.values() if c.kind == "image"]
    label_fields = labelchecks.host_fields(spec) if policy == "skip" else []  # labels, JSON, .npy: labelchecks
    cache = ShardCache(str(cache_dir / "shards"), cache_limit, transfer)
    shuffle = BlockShuffle(spec.shuffle_block, spec.shuffle_window) if spec.shuffled else None
    resolved = resolve_shards(shards)
    record = _record_name(resolved, spec, policy, max_pixels)
    found = snapshot.load(cache_dir, record) if record else None
    if found is not None:  # local shards opened before with these settings: O(shards)
        return ShardSet(found.paths, found.index_paths, found.sizes, found.skipped, found.converted, found.raw_bytes,
                        transfer=transfer, shuffle=shuffle, cache_dir=str(cache_dir))
    if record:  # every shard local: the missing indexes are built in parallel first
        prepare_indexes(resolved, cache_dir, salvage=policy == "skip")
    paths, idxs, sizes, kinds = [], [], [], []
    skipped: list[tuple[str, str, str]] = []
    converted: list[tuple[str, str, str]] = []
    raw = 0
    # the check workers take a group's images together; a cached (remote) shard is checked before the next
    # is fetched, so a bounded shard cache never evicts one that is still to be checked
    together = SHARDS_AT_ONCE if record else 1
    for at in range(0, len(resolved), together):
        group = []
        for p in resolved[at: at + together]:
            where = locate(p, cache_dir, cache, check_locally=policy == "skip")
            raw += where.nbytes
            skipped += [(p, key, reason) for key, reason in left_out(where.index)]  # repeated keys, damage
            kept = _complete(p, where.samples, spec, skipped)
            if label_fields and where.local:  # on_error: skip: samples whose label, JSON or .npy is refused left out
                kept = labelchecks.drop_bad(p, where.local, kept, label_fields, cache_dir, skipped)
            group.append((p, where, kept))
        checked = [(where.local, kept) for _, where, kept in group if image_exts and kept and where.local]
        checks = iter(check_shards(checked, image_exts, max_pixels=max_pixels, cache=cache_dir,
                                   decode=policy == "skip", seconds=spec.check_seconds) if checked else [])
        for p, where, kept in group:
            side = None
            if image_exts and kept and where.local:
                check = next(checks)
                if check.bad and policy == "raise":
                    key, reason = next(iter(check.bad.items()))
                    raise SampleError("image cannot be read (on_error is `raise`)", shard=p, key=key,
                                      reason=f"{reason}; set on_error='skip' to leave such samples out")
                kept = check.kept
                skipped += [(p, k, r) for k, r in check.bad.items()]
                converted += [(p, k, r) for k, r in check.converted.items()]
                if check.side_shard:
                    side = (check.side_shard, check.side_index, check.side_count)
            # DALI reads exactly what an index lists: one index of the kept samples leaves the rest out
            index_path = str(where.index) if len(kept) in (0, len(where.samples)) else \
                subset_index(where.local or str(where.index), kept, cache_dir, "filtered")
            entries = ([(p, index_path, len(kept), where.kind)] if kept else []) + (
                [(side[0], str(side[1]), side[2], "file")] if side else [])
            for path, index, size, kind in entries:
                paths.append(path)
                idxs.append(index)
                sizes.append(size)
                kinds.append(kind)
    if not paths and skipped:  # under skip, say why nothing is left, not "0 samples"
        shard, key, reason = skipped[0]
        raise ShardError(f"no sample of the {len(resolved)} shard(s) can be read: every one was left out "
                         f"({len(skipped)} listed); the first: shard {shard!r}, sample {key!r}: {reason}")
    remote = any(k != "file" for k in kinds)
    if record:
        snapshot.save(cache_dir, record, snapshot.Opened(tuple(paths), tuple(idxs), tuple(sizes), tuple(skipped),
                                                         tuple(converted), raw))
    return ShardSet(tuple(paths), tuple(idxs), tuple(sizes), tuple(skipped), tuple(converted), raw,
                    kinds=tuple(kinds) if remote else (), cache=cache if "cache" in kinds else None, transfer=transfer,
                    shuffle=shuffle, cache_dir=str(cache_dir))
