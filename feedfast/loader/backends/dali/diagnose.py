"""Turning a DALI pipeline failure into an error that names the shard and sample."""

from __future__ import annotations

import re
from typing import Any

from feedfast.checks.validate import DEFAULT_MAX_PIXELS
from feedfast.compile.plan import Plan
from feedfast.errors import FeedfastError, SampleError
from feedfast.sources.mixture import Dataset

_FAILED = re.compile(r"Failed to decode sample #(\d+) : ([^\n|]*)")
HINT = ("set on_error='skip' (spec `source: {on_error: skip}`) to leave undecodable samples out (over images read "
        "in place, on backend='threads' or 'pil')")


def first_line(exc: BaseException) -> str:
    """The line of a DALI error worth showing (the first that mentions an error)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if ("Error" in ln or "error" in ln or "ailed" in ln) and not ln.endswith(":")]
    return next(iter(useful), lines[0] if lines else repr(exc))


SCAN_LIMIT = 20_000  # images checked when nothing narrows the search, before giving up


def diagnose(exc: BaseException, plan: Plan, step: int, shards: Dataset, stream: Any = None, *,
             max_pixels: int = DEFAULT_MAX_PIXELS) -> FeedfastError:
    """Turn a DALI failure into an error naming the shard, sample and reason where possible.

    The reader's ``source_info`` names the sample; an external source has none, and the
    stream transport (``stream``) names it by its number in the batch. The reason comes
    from checking the named image again with PIL and DALI's CPU decoder (DALI's exception
    text lacks it). When nothing names the sample, the step's images (stream), else the shards' images (at most ``SCAN_LIMIT`` of them) are checked in
    order and the first that either decoder rejects is named.

    Args:
        exc: what DALI raised.
        plan: the loader's plan (its spec says which components are images).
        step: the epoch step that failed.
        shards: the opened shards.
        stream: the stream transport, when the dataset is streamed.
        max_pixels: the loader's pixel limit (images above it are reported as such).
    """
    exts = [{e.lower() for e in c.ext.split(";")} for c in plan.spec.components.values() if c.kind == "image"]
    named = _named(exc, step, stream)
    if named is not None:
        shard, key = named
        reason = _reason(shards, shard, key, exts, max_pixels) or first_line(exc)
        return SampleError("DALI could not decode a sample", shard=shard, key=key, reason=f"{reason}; {HINT}")
    found = None
    if exts:
        try:
            found = _search(shards, stream, step, exts, max_pixels)
        except FeedfastError:
            found = None
    if found:
        return SampleError("DALI could not decode a sample", shard=found[0], key=found[1], reason=f"{found[2]}; {HINT}")
    return FeedfastError(f"DALI pipeline failed at epoch step {step}: {first_line(exc)}; no image checked fails PIL or "
                         "DALI's CPU decoder (a GPU decoder or another operator failed, or the image lies beyond those "
                         "checked: `feedfast shards inspect --check SHARDS` checks every image)")


def _named(exc: BaseException, step: int, stream: Any) -> tuple[str, str] | None:
    from feedfast.loader.backends.dali.convert import sample_origin

    m = _FAILED.search(str(exc))
    if m and m.group(2).strip():
        return sample_origin(m.group(2).strip())
    if m and stream is not None:
        return tuple(stream.origins(step, int(m.group(1)) + 1)[-1])  # type: ignore[return-value]
    return None


def _reason(shards: Dataset, shard: str, key: str, exts: list[set[str]], max_pixels: int) -> str | None:
    from feedfast.checks.checked import image_reason

    if shard not in shards.paths or not exts or shards.read_kinds[shards.paths.index(shard)] not in ("file", "cache"):
        return None
    i = shards.paths.index(shard)
    if i >= len(shards.index_paths):  # images in place: no tar index (their feed names a bad sample itself)
        return None
    try:
        return image_reason(shard, shards.index_paths[i], key, exts, max_pixels)
    except FeedfastError:
        return None


def _search(shards: Dataset, stream: Any, step: int, exts: list[set[str]],
            max_pixels: int) -> tuple[str, str, str] | None:
    from feedfast.checks.checked import find_bad_image

    if stream is not None:
        return stream.bad_sample(step, exts, max_pixels)  # type: ignore[no-any-return]
    local = [(p, i) for p, i, k in zip(shards.paths, shards.index_paths, shards.read_kinds) if k == "file"]
    return find_bad_image([p for p, _ in local], [i for _, i in local], exts, max_pixels, limit=SCAN_LIMIT)
