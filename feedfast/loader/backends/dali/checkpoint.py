"""What a state's DALI checkpoint holds, checked on load against the pipeline this spec builds.

DALI's checkpoint (``Pipeline.checkpoint()``, DALI 2.4) is a protobuf ``Checkpoint`` message:
field 1, repeated, one ``OpCheckpoint`` per operator (field 1 its name, field 2 its state),
and field 2 the pipeline's external context (its iteration, as JSON). A pipeline restores only
the operators it has; a checkpoint of another spec's pipeline fails inside DALI, mid-epoch on the
producer thread, or restores the wrong generators. :func:`check_operators` refuses it on load, in
one line naming the field. DALI's own copies (``__MakeContiguous_*``) are not compared: DALI adds
them as it builds.
"""

from __future__ import annotations

import logging
from typing import Any

from feedfast.compile.plan import Plan
from feedfast.errors import UserError
from feedfast.sources.mixture import Dataset

log = logging.getLogger("feedfast")

_FIELD = "dali.checkpoint"
_INTERNAL = "__MakeContiguous"


def _damaged(what: str) -> UserError:
    return UserError(f"cannot resume from this state: field {_FIELD!r} must be DALI's checkpoint of this spec's "
                     f"pipeline, got {what}")


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise _damaged(f"damaged protobuf (a number cut at byte {at})")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, bytes]]:
    """A message's length-delimited fields as (number, bytes); any other wire type is damage here."""
    out, at = [], 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire != 2:
            raise _damaged(f"damaged protobuf (field {number} of wire type {wire} at byte {at})")
        size, at = _varint(data, at)
        if at + size > len(data):
            raise _damaged(f"damaged protobuf (field {number} runs past the end)")
        out.append((number, data[at:at + size]))
        at += size
    return out


def checkpoint_operators(checkpoint: str) -> list[str]:
    """The operator names in a DALI checkpoint (as text, the form a state gives back).

    Raises:
        UserError: it is not a DALI checkpoint (damaged, truncated, or another format).
    """
    data = checkpoint.encode("latin-1", errors="replace")
    names = []
    for number, body in _fields(data):
        if number == 1:
            inner = dict(_fields(body))
            if 1 not in inner:
                raise _damaged("damaged protobuf (an operator without a name)")
            names.append(inner[1].decode("utf-8", errors="replace"))
        elif number != 2:
            raise _damaged(f"damaged protobuf (unknown field {number})")
    if not names:
        raise _damaged("a checkpoint of no operator")
    return names


def pipeline_operators(plan: Plan, shards: Dataset, *, fed: bool, batch_size: int) -> set[str] | None:
    """The operators of the pipeline this plan builds (``fed``: from feedfast's feed, else DALI's reader),
    defined, not built; None where this DALI does not say (the names are then not compared)."""
    from feedfast.compile.dali import ReaderConfig, build_pipeline

    reader = ReaderConfig(paths=list(shards.paths), index_paths=list(shards.index_paths),
                          feed=_no_feed if fed else None)
    pipe, _ = build_pipeline(plan, reader, batch_size=batch_size, num_threads=1, device_id=None, seed=0)
    try:
        pipe.serialize()  # defines the graph (no build, no GPU): its operators are then listed
        return {op.name for op in pipe._ops}
    except (AttributeError, TypeError, RuntimeError) as exc:
        log.warning("cannot list the operators of this DALI's pipeline (%s): a state's checkpoint is checked "
                    "for its form only", exc)
        return None
    finally:
        del pipe


def _no_feed(info: Any) -> Any:
    raise RuntimeError("a pipeline defined to list its operators is never run")


def check_operators(checkpoint: str, expected: set[str] | None) -> None:
    """Refuse a checkpoint that is not DALI's, or whose operators are not ``expected`` (one line, naming the field).

    Raises:
        UserError: what is wrong: damaged, or the operators that differ.
    """
    names = {n for n in checkpoint_operators(checkpoint) if not n.startswith(_INTERNAL)}
    if expected is None:
        return
    missing, foreign = sorted(expected - names), sorted(names - expected)
    if missing or foreign:
        parts = ([f"lacks {', '.join(missing)}"] if missing else []) + \
                ([f"has {', '.join(foreign)} that this pipeline does not"] if foreign else [])
        raise UserError(f"cannot resume from this state: field {_FIELD!r} is DALI's checkpoint of another pipeline "
                        f"(it {'; it '.join(parts)}): take the state with this spec, these shards and this "
                        f"shuffle setting")
