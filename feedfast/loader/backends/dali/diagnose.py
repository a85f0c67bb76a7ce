"""Turning a DALI pipeline failure into an error that names the shard and sample."""

from __future__ import annotations

import re

from feedfast.checks.validate import DEFAULT_MAX_PIXELS
from feedfast.compile.plan import Plan
from feedfast.errors import FeedfastError, SampleError
from feedfast.loader.backends.dali.stream import StreamEpoch

_FAILED = re.compile(r"Failed to decode sample #(\d+)")
HINT = ("set on_error='skip' (spec `source: {on_error: skip}`) to leave undecodable samples out (over images read "
        "in place, on backend='threads' or 'pil')")


def first_line(exc: BaseException) -> str:
    """The line of a DALI error worth showing (the first that mentions an error)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if ("Error" in ln or "error" in ln or "ailed" in ln) and not ln.endswith(":")]
    return next(iter(useful), lines[0] if lines else repr(exc))


def diagnose(exc: BaseException, plan: Plan, step: int, stream: StreamEpoch, *,
             max_pixels: int = DEFAULT_MAX_PIXELS) -> FeedfastError:
    """Turn a DALI failure into an error naming the shard, sample and reason where possible.

    DALI's message numbers the sample in its batch (an external source has no ``source_info``), and the epoch's
    feed (``stream``) names it; the reason comes from probing its images again with PIL and DALI's CPU decoder
    (DALI's exception text lacks it), else it is DALI's message. When the message numbers none, the step's images
    are probed in order and the first that either decoder rejects is named.

    Args:
        exc: what DALI raised.
        plan: the loader's plan (its spec says which components are images).
        step: the epoch step that failed.
        stream: the epoch's feed (:class:`~feedfast.loader.backends.dali.stream.StreamEpoch`).
        max_pixels: the loader's pixel limit (images above it are reported as such).
    """
    exts = [{e.lower() for e in c.ext.split(";")} for c in plan.spec.components.values() if c.kind == "image"]
    m = _FAILED.search(str(exc))
    at = int(m.group(1)) if m else None
    found = None
    if exts:
        try:
            found = stream.bad_sample(step, exts, max_pixels, at=at)
        except FeedfastError:  # the step cannot be read again (a stream's shard)
            found = None
    if found is None and at is not None:
        shard, key = stream.origins(step, at + 1)[-1]
        found = (shard, key, first_line(exc))
    if found:
        shard, key, reason = found
        return SampleError("DALI could not decode a sample", shard=shard, key=key, reason=f"{reason}; {HINT}")
    return FeedfastError(f"DALI pipeline failed at epoch step {step}: {first_line(exc)}; no image of the step fails "
                         "PIL or DALI's CPU decoder (a GPU decoder or another operator failed: `feedfast shards inspect "
                         "--check SHARDS` checks every image)")
