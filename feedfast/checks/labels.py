"""Labels, JSON and NumPy components checked when shards are opened under ``on_error: skip``.

A field whose ops all run on the host (``label``, ``json``, ``npy``, ``bytes``: see
:mod:`feedfast.ops.generic`) turns one component's bytes into a value after the DALI graph, on
every backend. Under ``on_error: skip`` each such field with an op that can refuse bytes
(``OpDef.refuses``: all but ``bytes``) is run here, once per sample, on the
bytes the loader would read; a sample any of them refuses (a ``.cls`` that is not a plain
integer within int64, JSON that does not parse, a ``.npy`` that does not load or cast) is left
out with the reason, counted in ``loader.stats()['skipped']`` and listed in
``loader.skipped_samples()``, exactly like an undecodable image. The verdicts are cached per
shard (by its path, size and mtime, the sample keys and the fields' ops and parameters), so a
shard is read for this once.

Under ``on_error: raise`` nothing is read here: the host op refuses the sample when its batch
is made, as a ``SampleError`` naming the shard, the key and the bytes seen.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from feedfast.errors import ShardError
from feedfast.ops.generic import DecodeFailure
from feedfast.ops.registry import OPS
from feedfast.shards.index.tarindex import Sample, first_member, shard_digest, write_atomic
from feedfast.spec.model import OpCall, Spec

LABEL_RULES = 1  # bump when what a verdict means changes: cached verdicts of older rules are not reused


@dataclass(frozen=True)
class HostField:
    """A field made on the host from one component: the component's extensions and the ops in order."""

    name: str
    exts: frozenset[str]
    ops: tuple[OpCall, ...]


def host_fields(spec: Spec) -> list[HostField]:
    """The spec's fields checked here (in output order): every op runs on the host and one may refuse
    a sample (``OpDef.refuses``; a ``bytes`` field is never read for this)."""
    out = []
    for name in spec.outputs:
        pipe = spec.fields[name]
        ops = [OPS[call.op] for call in pipe.ops]
        if ops and all(op.host for op in ops) and any(op.refuses for op in ops):
            ext = spec.components[pipe.source].ext
            out.append(HostField(name, frozenset(e.lower() for e in ext.split(";")), pipe.ops))
    return out


def rules(fields: list[HostField]) -> list[Any]:
    """What the verdicts depend on, JSON-safe: a cache key (and a part of the open-shards record's)."""
    return [LABEL_RULES, [[f.name, sorted(f.exts), [[c.op, c.params] for c in f.ops]] for f in fields]]


def drop_bad(name: str, local: str, samples: list[Sample], fields: list[HostField], cache: Path,
             skipped: list[tuple[str, str, str]]) -> list[Sample]:
    """The samples every host field accepts; the others are appended to ``skipped`` as (shard, key, reason).

    Args:
        name: the shard as given (what ``skipped`` names).
        local: the file its bytes are read from (the shard itself, or its cached copy).
        samples: the samples to check (those with their components).
        fields: :func:`host_fields` of the spec.
        cache: feedfast's cache folder (verdicts under ``labelchecks/``).

    Raises:
        ShardError: the shard cannot be read.
    """
    if not fields or not samples:
        return samples
    tag = shard_digest(local, json.dumps(rules(fields), sort_keys=True, default=str), [s.key for s in samples])
    cached = cache / "labelchecks" / f"{Path(local).stem}-{tag}.json"
    if cached.is_file():
        bad: dict[str, str] = json.loads(cached.read_text(encoding="utf-8"))
    else:
        bad = refused(name, local, samples, fields)
        write_atomic(cached, json.dumps(bad))
    skipped += [(name, s.key, bad[s.key]) for s in samples if s.key in bad]
    return [s for s in samples if s.key not in bad] if bad else samples


def refused(name: str, local: str, samples: list[Sample], fields: list[HostField]) -> dict[str, str]:
    """{key: reason} of the samples a host field refuses, read from ``local`` in tar order, uncached
    (what ``feedfast shards inspect --check`` can report too).

    Raises:
        ShardError: the shard cannot be read.
    """
    bad: dict[str, str] = {}
    rng = random.Random(0)  # these ops draw nothing; a host op that did would draw from this
    try:
        with open(local, "rb") as f:
            for sample in samples:
                reason = _first_refusal(f, sample, fields, rng)
                if reason is not None:
                    bad[sample.key] = reason
    except OSError as exc:
        raise ShardError(f"shard not readable: {name!r} ({exc.strerror or exc})") from exc
    return bad


def _first_refusal(f: BinaryIO, sample: Sample, fields: list[HostField], rng: random.Random) -> str | None:
    """Why the first field that refuses this sample does (None: every field accepts it)."""
    for field in fields:
        member = first_member(sample, field.exts)
        value: Any = b""  # a missing component arrives empty (``missing: empty``)
        if member is not None:
            f.seek(member.offset)
            value = f.read(member.size)
        for call in field.ops:
            try:
                value = OPS[call.op].pil(value, call.params, rng)  # type: ignore[misc]
            except DecodeFailure as exc:
                what = member.name if member is not None else f"no {field.name} component"
                return f"{what}: `{call.op}` failed ({call.key}): {exc}"
    return None
