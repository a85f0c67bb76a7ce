"""The loader's resume state: JSON-safe, versioned, with DALI's checkpoint as text."""

from __future__ import annotations

import base64
from typing import Any

from feedfast.errors import UserError

STATE_VERSION = 1


def encode_checkpoint(checkpoint: str | bytes) -> str:
    """DALI's checkpoint (bytes or str) as JSON-safe text."""
    raw = checkpoint.encode("latin-1") if isinstance(checkpoint, str) else bytes(checkpoint)
    return base64.b64encode(raw).decode("ascii")


def decode_checkpoint(text: str) -> str:
    """The inverse of :func:`encode_checkpoint`, in the form DALI's ``Pipeline(checkpoint=)`` takes."""
    return base64.b64decode(text).decode("latin-1")


def check_state(state: Any, *, seed: int, rank: int, world: int) -> None:
    """Raise UserError unless ``state`` is a feedfast loader state saved with this seed, rank and world."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise UserError("not a feedfast loader state (or from another version)")
    if (state["seed"], state["world_size"], state["rank"]) != (seed, world, rank):
        raise UserError("state was saved with another seed, rank or world size: "
                        f"{state['seed']}/{state['rank']}/{state['world_size']} vs {seed}/{rank}/{world}")
