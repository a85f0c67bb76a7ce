"""The loader's resume state: JSON-safe, versioned, with DALI's checkpoint as text.

A state is honoured only by a loader that would read the same samples in the same
order: same seed, rank and world size, and (when the state records them) the same
batch size, the same shard set (paths and the samples each contributes, after checks)
and the same spec. Anything else is refused with what differs, never applied silently:
a state saved at step 3 with batches of 16 points at sample 48; read with batches of 32
it would point at sample 96.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Sequence

from feedfast.errors import UserError

STATE_VERSION = 1


def encode_checkpoint(checkpoint: str | bytes) -> str:
    """DALI's checkpoint (bytes or str) as JSON-safe text."""
    raw = checkpoint.encode("latin-1") if isinstance(checkpoint, str) else bytes(checkpoint)
    return base64.b64encode(raw).decode("ascii")


def decode_checkpoint(text: str) -> str:
    """The inverse of :func:`encode_checkpoint`, in the form DALI's ``Pipeline(checkpoint=)`` takes."""
    return base64.b64decode(text).decode("latin-1")


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


def check_state(state: Any, *, seed: int, rank: int, world: int, batch_size: int | None = None,
                shards: str | None = None, spec: str | None = None) -> None:
    """Raise UserError unless ``state`` can be honoured by this loader, naming every difference.

    Args:
        state: what ``state_dict()`` returned.
        seed, rank, world: this loader's.
        batch_size: this loader's batch size; compared with the state's ``batch_size``.
        shards: :func:`shard_set_digest` of this loader's shards; compared with the state's ``shards``.
        spec: :func:`spec_digest` of this loader's spec; compared with the state's ``spec``.

    A keyword left None, or a key the state lacks (a state from before it was recorded),
    is not compared.
    """
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise UserError("not a feedfast loader state (or from another version)")
    missing = [k for k in ("epoch", "step", "seed", "rank", "world_size", "stats") if k not in state]
    if missing:
        raise UserError(f"not a complete feedfast loader state: it lacks {', '.join(missing)}")
    differs = []
    if (state["seed"], state["world_size"], state["rank"]) != (seed, world, rank):
        differs.append("state was saved with another seed, rank or world size: "
                       f"{state['seed']}/{state['rank']}/{state['world_size']} vs {seed}/{rank}/{world}")
    if batch_size is not None and state.get("batch_size", batch_size) != batch_size:
        differs.append(f"batch size {state['batch_size']} in the state vs {batch_size} here "
                       "(its step would point at other samples)")
    if shards is not None and state.get("shards", shards) != shards:
        differs.append(f"another shard set (digest {state['shards']} in the state vs {shards} here: shards added, "
                       "removed, reordered, or their checks now keep other samples)")
    if spec is not None and state.get("spec", spec) != spec:
        differs.append(f"another spec (digest {state['spec']} in the state vs {spec} here)")
    if differs:
        raise UserError("cannot resume from this state: " + "; ".join(differs) +
                        "; resume with the settings it was saved with, or start the epoch afresh")
