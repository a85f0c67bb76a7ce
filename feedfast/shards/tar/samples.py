"""A local tar read into samples: whole (:func:`scan_tar`), or as far as its damage (:func:`salvage_tar`).

Members are read by :mod:`.tarscan` and grouped into samples by :mod:`.members`. A key the
shard holds twice is read once: the later samples are left out with a
:class:`RepeatedKeyWarning`, raised once per process (:func:`warn_once`), since a shard
indexed in a worker process and then opened here would otherwise warn twice.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

from feedfast.shards.tar.members import (
    Sample,
    collector_paused,
    group_members,
    new_member,
    split_duplicates,
    split_name,
)
from feedfast.shards.tar.scan import Damage, salvage_members, scan_members


class RepeatedKeyWarning(UserWarning):
    """A shard holds a key more than once: only its first sample is read."""

def scan_tar(path: str | os.PathLike[str], *, keep_duplicates: bool = False, name: str | None = None) -> list[Sample]:
    """Read a tar's headers and group its regular files into samples.

    The headers are read by :func:`feedfast.shards.tar.scan.scan_members`: what :mod:`tarfile`
    reads, faster, and stricter about damage.

    Args:
        path: a local tar file.
        keep_duplicates: keep every sample of a repeated key (for inspection); by default
            only the first is kept and the rest are named in a warning.
        name: the shard's name in messages when it is not ``path`` (a cached copy of a remote shard is
            named by its URL).

    Returns:
        The samples in tar order.

    Raises:
        ShardError: the file is missing, unreadable, compressed, not a tar, truncated (also when it
            ends without an end-of-archive block: cut at a member boundary), corrupt, or holds a
            GNU sparse member.
    """
    path = os.fspath(path)
    samples = _grouped(scan_members(path, name=name))
    if keep_duplicates:
        return samples
    unique, repeated = split_duplicates(samples)
    if repeated:
        warn_once(repeated_message(path if name is None else name, [s.key for s in repeated]), RepeatedKeyWarning,
                  stacklevel=3)
    return unique

@dataclass(frozen=True)
class Scanned:
    """A tar read as far as it can be: its samples (the first of each key), what was left out, the damage."""

    samples: list[Sample]
    repeated: tuple[str, ...] = ()
    damage: Damage | None = None
    lost: tuple[str, ...] = ()

def salvage_tar(path: str | os.PathLike[str], *, keep_duplicates: bool = False, name: str | None = None) -> Scanned:
    """The samples of a tar, or of a damaged tar those wholly before the damage, with what is lost.

    A sample is lost with the damage when the damaged member (whose header could be read) is
    one of its own, or when the damage gives no name (the file is cut, or garbage stands where a header should be) and the
    sample, the last before it, lacks a component the sample before it has (its other members may
    have been cut off). The samples after the damage cannot be read at all.

    With ``keep_duplicates`` every sample of a repeated key is kept (for inspection), and
    ``repeated`` is empty. ``name`` names the shard in messages, as for :func:`scan_tar`.

    Raises:
        ShardError: the file is missing, unreadable, compressed or holds a sparse member.
    """
    path = os.fspath(path)
    found, damage = salvage_members(path, name=name)
    every = _grouped(found)
    samples, repeated = (every, []) if keep_duplicates else split_duplicates(every)
    lost: tuple[str, ...] = ()
    if damage is not None and damage.member is not None:  # the damaged member's sample is lost, whatever it kept
        lost = (split_name(damage.member)[0],)
        if samples and samples[-1].key == lost[0]:
            samples = samples[:-1]
    elif damage is not None and samples:
        last = samples[-1]
        if len(samples) < 2 or not set(samples[-2].exts) <= set(last.exts):
            samples, lost = samples[:-1], (last.key,)
    return Scanned(samples, tuple(s.key for s in repeated), damage, lost)

def _grouped(found: list[tuple[str, int, int]]) -> list[Sample]:
    members = []
    with collector_paused():
        for name, offset, size in found:
            key, ext = split_name(name)
            members.append(new_member(key, ext, offset, size, name))
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
