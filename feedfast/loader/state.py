"""The loader's resume state as data: typed, nested per stage, versioned, validated field by field on load.

A state (``DataLoader.state_dict()``, version 2) is a JSON-safe dict: the loader's own part
at the top (where the next iteration resumes, what a loader must match to honour it, which
backend, the counts so far) and each stage that keeps state of its own below it under its
name, as torchdata's nodes nest their sources' states::

    {"version": 2,
     "epoch": 0, "step": 3, "consumed": 0,                        # ResumePoint
     "seed": 3, "rank": 0, "world_size": 1, "batch_size": 4,      # Identity: what must match
     "partition": "shards", "shards": "<digest>", "spec": "<digest>",
     "backend": "dali",
     "stats": {"delivered": 12, "skipped": 0, "padded": 0, "dropped": 0, "batches": 3},
     "dali": {"checkpoint": "<base64>", "step": 2},               # the DALI stage's part, or null
     "tuned": {"threads": 3, "prefetch": 2},                      # the tuner's part, or null
     "lost": [{"shard": "<url>", "reason": "...", "keys": ["k1"]}]}  # only when samples were skipped mid-epoch

``lost`` lists the samples skipped mid-epoch so far (a shard unreadable under ``on_error: skip``,
:mod:`feedfast.sources.lostrows`), grouped by shard and reason: a resumed loader's
``skipped_samples()`` names them as the interrupted one did. A state without it skipped none.

``dali.checkpoint`` is DALI's checkpoint taken after ``dali.step`` batches (DALI checkpoints
only every few batches, :data:`~feedfast.loader.backends.dali.pipe.CHECKPOINT_EVERY`, or every batch
under ``sample_info``): the backend rebuilds its pipeline from it and steps forward to
``step``. ``dali: null`` is the epoch's start (a pipeline built afresh steps forward to
``step``); the threaded and PIL backends resume from the step alone and have no part.

A state is honoured only by a loader that would read the same samples in the same order:
same seed, rank and world size, and (when the state records them) the same batch size,
the same shard set (paths and the samples each contributes, after checks) and the same
spec. Anything else is refused with what differs, never applied silently: a state saved at
step 3 with batches of 16 points at sample 48; read with batches of 32 it would point at
sample 96. A state that is damaged, truncated, tampered with or foreign is refused with a
one-line :class:`~feedfast.errors.UserError` naming the first field that is wrong
(:func:`parse_state`). Version 1 states (flat, from earlier feedfast) still load.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from feedfast.errors import UserError

STATE_VERSION = 2
READS = (1, 2)
"""The state versions this feedfast loads."""
BACKEND_NAMES = ("dali", "threads", "pil")
PARTITIONS = ("shards", "global", "block")
STAT_KEYS = ("delivered", "skipped", "padded", "dropped", "batches")


@dataclass(frozen=True)
class ResumePoint:
    """Where an iteration starts: ``step`` batches of ``epoch`` already handed out.

    Args:
        epoch: the epoch.
        step: batches of the epoch already handed out (the next one is this index).
        consumed: samples of the epoch's global order taken before the epoch's plan (an elastic
            resume: the plan starts after them, at step 0).
        checkpoint: the backend's state after ``checkpoint_step`` batches (DALI's checkpoint, as
            DALI's ``Pipeline(checkpoint=)`` takes it), or None: the epoch's start.
        checkpoint_step: the step ``checkpoint`` was taken at (<= ``step``): the backend starts
            there and the loader steps forward to ``step``.
    """

    epoch: int
    step: int = 0
    consumed: int = 0
    checkpoint: str | None = None
    checkpoint_step: int = 0

    @property
    def skip(self) -> int:
        """Batches the backend makes from ``checkpoint_step`` that were already handed out."""
        return self.step - self.checkpoint_step


@dataclass(frozen=True)
class Identity:
    """What a loader must match to honour a state (None: not recorded, not compared)."""

    seed: int
    rank: int
    world_size: int
    batch_size: int | None = None
    partition: str | None = None
    shards: str | None = None
    spec: str | None = None


@dataclass(frozen=True)
class LoaderState:
    """A loader's state: its resume point, identity, counts, and each stage's part."""

    resume: ResumePoint
    identity: Identity
    backend: str
    stats: dict[str, int] = field(default_factory=dict)
    tuner: dict[str, int] | None = None
    lost: tuple[tuple[str, str, str], ...] = ()  # samples skipped mid-epoch: (shard, key, reason)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe form (version 2; see the module docstring)."""
        r, i = self.resume, self.identity
        dali = None
        if r.checkpoint is not None:
            dali = {"checkpoint": encode_checkpoint(r.checkpoint), "step": r.checkpoint_step}
        out: dict[str, Any] = {
            "version": STATE_VERSION, "epoch": r.epoch, "step": r.step, "consumed": r.consumed,
            "seed": i.seed, "rank": i.rank, "world_size": i.world_size, "batch_size": i.batch_size,
            "partition": i.partition, "shards": i.shards, "spec": i.spec, "backend": self.backend,
            "stats": dict(self.stats), "dali": dali,
            "tuned": dict(self.tuner) if self.tuner is not None else None,
        }
        if self.lost:
            out["lost"] = _group(self.lost)
        return out

    def check_matches(self, *, seed: int, rank: int, world: int, batch_size: int | None = None,
                      shards: str | None = None, spec: str | None = None) -> None:
        """Raise UserError unless a loader with these settings can honour this state, naming every difference.

        A keyword left None, or a field the state lacks (a state from before it was recorded),
        is not compared.
        """
        i = self.identity
        differs = []
        if (i.seed, i.world_size, i.rank) != (seed, world, rank):
            differs.append("state was saved with another seed, rank or world size: "
                           f"{i.seed}/{i.rank}/{i.world_size} vs {seed}/{rank}/{world}")
        if batch_size is not None and i.batch_size is not None and i.batch_size != batch_size:
            differs.append(f"batch size {i.batch_size} in the state vs {batch_size} here "
                           "(its step would point at other samples)")
        if shards is not None and i.shards is not None and i.shards != shards:
            differs.append(f"another shard set (digest {i.shards!r} in the state vs {shards!r} here: shards added, "
                           "removed, reordered, or their checks now keep other samples)")
        if spec is not None and i.spec is not None and i.spec != spec:
            differs.append(f"another spec (digest {i.spec!r} in the state vs {spec!r} here)")
        if differs:
            raise UserError("cannot resume from this state: " + "; ".join(differs) +
                            "; resume with the settings it was saved with, or start the epoch afresh")


# ---------------------------------------------------------------------------- checkpoints and digests
def encode_checkpoint(checkpoint: str | bytes) -> str:
    """DALI's checkpoint (bytes or str) as JSON-safe text."""
    raw = checkpoint.encode("latin-1") if isinstance(checkpoint, str) else bytes(checkpoint)
    return base64.b64encode(raw).decode("ascii")


def decode_checkpoint(text: str) -> str:
    """The inverse of :func:`encode_checkpoint`, in the form DALI's ``Pipeline(checkpoint=)`` takes.

    Raises:
        UserError: ``text`` is not base64.
    """
    try:
        return base64.b64decode(text, validate=True).decode("latin-1")
    except (binascii.Error, ValueError) as exc:
        raise _bad("dali.checkpoint", "base64 text (DALI's checkpoint)", text) from exc


def shard_set_digest(paths: Sequence[str], sizes: Sequence[int]) -> str:
    """A short digest of a dataset as the loader reads it: shard paths in order and samples per shard.

    Put it in the state as ``"shards"``; a changed shard list, or a shard whose checks now
    keep another number of samples, gives another digest.
    """
    text = json.dumps([[str(p), int(n)] for p, n in zip(paths, sizes)])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def spec_digest(spec_dict: dict[str, Any]) -> str:
    """A short digest of a spec's plain data (``Spec.to_dict()``) without its batch size (compared apart) and
    its run-time sections (``loader``, ``tune``: they do not change the data)."""
    data = {k: v for k, v in spec_dict.items() if k not in ("loader", "tune")}
    data["batch"] = {k: v for k, v in spec_dict.get("batch", {}).items() if k != "size"}
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- parsing
def parse_state(state: Any) -> LoaderState:
    """A :class:`LoaderState` from what ``state_dict()`` returned (version 1 or 2), every field checked.

    Raises:
        UserError: not a feedfast loader state, a version this feedfast does not read, or a
            field missing, of the wrong type, out of range or unknown; one line naming it.
    """
    if not isinstance(state, dict):
        raise UserError(f"not a feedfast loader state: a dict from DataLoader.state_dict() is expected, "
                        f"got {type(state).__name__}")
    version = state.get("version")
    if isinstance(version, bool) or version not in READS:
        raise UserError(f"not a feedfast loader state, or one from another version: field 'version' is "
                        f"{_show(version)}; this feedfast reads versions {', '.join(map(str, READS))}")
    return _parse_v2(state) if version == 2 else _parse_v1(state)


_V2_KEYS = {"version", "epoch", "step", "consumed", "seed", "rank", "world_size", "batch_size", "partition",
            "shards", "spec", "backend", "stats", "dali", "tuned", "lost"}
_V1_KEYS = {"version", "epoch", "step", "seed", "rank", "world_size", "backend", "batch_size", "shards", "spec",
            "dali", "partition", "consumed", "tuned", "stats"}


def _parse_v2(state: dict[str, Any]) -> LoaderState:
    _known(state, _V2_KEYS, "")
    identity = _identity(state, optional=False)
    name = _choice(state, "backend", BACKEND_NAMES)
    text, jstep = None, _int(state, "step", 0)  # no checkpoint: the step alone, or the epoch's start for DALI
    part = state.get("dali", _MISSING)
    if part is _MISSING or part is not None:
        dali = _mapping(state, "dali", {"checkpoint", "step"})
        text = _optional_str(dali, "checkpoint", path="dali.checkpoint")
        if text is None:
            raise _bad("dali.checkpoint", "base64 text (DALI's checkpoint)", None)
        jstep = dali.get("step", _MISSING)
    elif name == "dali":
        jstep = 0
    resume = _resume(state, identity, text, jstep, name)
    return LoaderState(resume, identity, name, _stats(state), _tuner(state.get("tuned", _MISSING), "tuned"),
                       _lost(state))


def _parse_v1(state: dict[str, Any]) -> LoaderState:
    _known(state, _V1_KEYS, "")
    identity = _identity(state, optional=True)
    text = _optional_str(state, "dali", path="dali") if "dali" in state else None
    default = "dali" if text else "threads"
    name = _choice(state, "backend", BACKEND_NAMES) if "backend" in state else default
    resume = _resume(state, identity, text, _int(state, "step", 0), name)
    tuned = state.get("tuned")
    return LoaderState(resume, identity, name, _stats(state), _tuner(tuned, "tuned") if tuned is not None else None)


def _identity(state: dict[str, Any], *, optional: bool) -> Identity:
    seed = _int(state, "seed", None)
    world = _int(state, "world_size", 1)
    rank = _int(state, "rank", 0)
    if rank >= world:
        raise _bad("rank", f"an integer in [0, world_size={world})", rank)
    batch = _int(state, "batch_size", 1) if not optional or "batch_size" in state else None
    partition = (_choice(state, "partition", PARTITIONS) if not optional or "partition" in state else None)
    shards = _optional_str(state, "shards") if not optional or "shards" in state else None
    spec = _optional_str(state, "spec") if not optional or "spec" in state else None
    return Identity(seed, rank, world, batch, partition, shards, spec)


def _resume(state: dict[str, Any], identity: Identity, text: str | None, checkpoint_step: Any,
            backend: str) -> ResumePoint:
    epoch, step = _int(state, "epoch", 0), _int(state, "step", 0)
    consumed = _int(state, "consumed", 0) if "consumed" in state or state.get("version") == 2 else 0
    if consumed and identity.partition not in (None, "global"):
        raise _bad("consumed", "0 outside the global order (partition 'global')", consumed)
    jstep = _int({"step": checkpoint_step}, "step", 0, path="dali.step")
    if jstep > step:
        raise _bad("dali.step", f"an integer in [0, step={step}]", jstep)
    checkpoint = None
    if text is not None:
        if backend != "dali":
            raise _bad("dali", f"null for backend {backend!r} (only DALI keeps a checkpoint)", "a checkpoint")
        checkpoint = decode_checkpoint(text)
        _check_wrapped(checkpoint)
    return ResumePoint(epoch, step, consumed, checkpoint, jstep)


def _check_wrapped(checkpoint: str) -> None:
    """A checkpoint of a rescued pipeline (:func:`~feedfast.loader.backends.dali.rescue.wrap_checkpoint`) must unwrap."""
    from feedfast.loader.backends.dali.rescue import unwrap_checkpoint

    try:
        dali, first, keys = unwrap_checkpoint(checkpoint)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _bad("dali.checkpoint", "a DALI checkpoint, or a rescued pipeline's (its JSON wrapper)",
                   "damaged text") from exc
    if dali is not None and not isinstance(dali, str) or first < 0:
        raise _bad("dali.checkpoint", "a rescued pipeline's checkpoint with a step >= 0", "damaged text")


def _stats(state: dict[str, Any]) -> dict[str, int]:
    stats = _mapping(state, "stats", {*STAT_KEYS, "converted"})
    out = {}
    for key in STAT_KEYS:
        out[key] = _int(stats, key, 0, path=f"stats.{key}")
    if "converted" in stats:
        _int(stats, "converted", 0, path="stats.converted")  # recomputed by the loader, not restored
    return out


def _group(lost: Sequence[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Skipped samples as runs of one shard and reason: ``{"shard", "reason", "keys"}`` each, in order."""
    out: list[dict[str, Any]] = []
    for shard, key, reason in lost:
        if not out or (out[-1]["shard"], out[-1]["reason"]) != (shard, reason):
            out.append({"shard": shard, "reason": reason, "keys": []})
        out[-1]["keys"].append(key)
    return out


def _lost(state: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    runs = state.get("lost", [])
    if not isinstance(runs, list):
        raise _bad("lost", "a list of {shard, reason, keys}", runs)
    out: list[tuple[str, str, str]] = []
    for i, run in enumerate(runs):
        path = f"lost[{i}]"
        run = _mapping({path: run}, path, {"shard", "reason", "keys"})
        for name in ("shard", "reason"):
            if not isinstance(run.get(name), str):
                raise _bad(f"{path}.{name}", "a string", run.get(name, _MISSING))
        keys = run.get("keys", _MISSING)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise _bad(f"{path}.keys", "a list of sample keys (strings)", keys)
        out += [(run["shard"], key, run["reason"]) for key in keys]
    return tuple(out)


def _tuner(value: Any, path: str) -> dict[str, int] | None:
    if value is _MISSING:
        raise _bad(path, "null or {threads, prefetch}", value)
    if value is None:
        return None
    tuned = _mapping({path: value}, path, {"threads", "prefetch"})
    return {key: _int(tuned, key, 1, path=f"{path}.{key}") for key in ("threads", "prefetch")}


# ---------------------------------------------------------------------------- field checks
_MISSING: Any = object()


def _show(value: Any) -> str:
    text = "missing" if value is _MISSING else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(path: str, allowed: str, value: Any) -> UserError:
    return UserError(f"cannot resume from this state: field '{path}' must be {allowed}, got {_show(value)} "
                     "(a damaged, tampered or foreign state)")


def _known(data: dict[str, Any], keys: set[str], prefix: str) -> None:
    unknown = sorted(str(k) for k in data if k not in keys)
    if unknown:
        raise UserError(f"cannot resume from this state: unknown field '{prefix}{unknown[0]}' (a foreign state, "
                        "or one from a newer feedfast)")


def _int(data: dict[str, Any], key: str, minimum: int | None, *, path: str | None = None) -> int:
    value = data.get(key, _MISSING)
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        allowed = "an integer" + (f" >= {minimum}" if minimum is not None else "")
        raise _bad(path or key, allowed, value)
    return value


def _optional_str(data: dict[str, Any], key: str, *, path: str | None = None) -> str | None:
    value = data.get(key, _MISSING)
    if value is not None and not isinstance(value, str):
        raise _bad(path or key, "a string or null", value)
    return value


def _choice(data: dict[str, Any], key: str, allowed: Sequence[str], *, path: str | None = None) -> str:
    value = data.get(key, _MISSING)
    if not isinstance(value, str) or value not in allowed:
        raise _bad(path or key, "one of " + ", ".join(repr(a) for a in allowed), value)
    return value


def _mapping(data: dict[str, Any], key: str, keys: set[str]) -> dict[str, Any]:
    value = data.get(key, _MISSING)
    if not isinstance(value, dict):
        raise _bad(key, "a mapping", value)
    _known(value, keys, f"{key}.")
    return value
