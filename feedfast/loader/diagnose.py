"""Turning a DALI pipeline failure into an error that names the shard and sample."""

from __future__ import annotations

import re
from typing import Any

from feedfast.compile.plan import Plan
from feedfast.errors import FeedfastError, SampleError
from feedfast.sources.dataset import ShardSet
from feedfast.sources.validate import DEFAULT_MAX_PIXELS

_FAILED = re.compile(r"Failed to decode sample #(\d+) : ([^\n|]*)")


def first_line(exc: BaseException) -> str:
    """The line of a DALI error worth showing (the first that mentions an error)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return next((ln for ln in lines if "Error" in ln or "error" in ln), lines[0] if lines else repr(exc))


def diagnose(exc: RuntimeError, plan: Plan, step: int, shards: ShardSet, stream: Any = None) -> FeedfastError:
    """Turn a DALI failure into an error naming the shard and sample where possible.

    The reader's ``source_info`` names the sample. An external source has none: the
    stream transport (``stream``) names the sample by its number in the batch, or reads
    the step's images again and probes them.
    """
    from feedfast.loader.convert import sample_origin
    from feedfast.sources.checked import find_bad_image

    text = str(exc)
    hint = "set on_error='skip' (spec `source: {on_error: skip}`) to leave undecodable samples out"
    m = _FAILED.search(text)
    if m and m.group(2).strip():
        shard, key = sample_origin(m.group(2).strip())
        return SampleError("DALI could not decode a sample", shard=shard, key=key, reason=f"{first_line(exc)}; {hint}")
    if m and stream is not None:
        shard, key = stream.origins(step, int(m.group(1)) + 1)[-1]
        return SampleError("DALI could not decode a sample", shard=shard, key=key, reason=f"{first_line(exc)}; {hint}")
    exts = [{e.lower() for e in c.ext.split(";")} for c in plan.spec.components.values() if c.kind == "image"]
    if stream is not None:
        found = stream.bad_sample(step, exts, DEFAULT_MAX_PIXELS) if exts else None
    else:
        found = find_bad_image(list(shards.paths), list(shards.index_paths), exts, DEFAULT_MAX_PIXELS) if exts else None
    if found:
        return SampleError("DALI could not decode a sample", shard=found[0], key=found[1], reason=f"{found[2]}; {hint}")
    return FeedfastError(f"DALI pipeline failed at epoch step {step}: {first_line(exc)}")
