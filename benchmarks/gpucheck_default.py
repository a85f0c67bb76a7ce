"""``gpu_check.py``'s rows at the anchor's batch (256 on a GPU): the README's default loader.

The default call is the README's on a GPU (the loader then must run DALI GPU-placed: anything else fails the row,
whose label would lie); a dry run stands in DALI CPU-placed at the dry run's small sizes, to the CPU.
"""

from __future__ import annotations

from typing import Any

from gpucheck_common import CheckFailed, Context
from gpucheck_sections import need_shards

DEFAULT_SPEC = "imagenet-train"
"""The shipped pipeline as the issue's default call names it."""


# ---------------------------------------------------------------------------- the default call
def default_loader(ctx: Context, batch: int, spec: str = DEFAULT_SPEC, **asked: Any) -> Any:
    """``feedfast.DataLoader(spec, shards=..., batch_size=batch, device="cuda", **asked)`` on a GPU; in a dry run the
    same DALI CPU-placed to the CPU at the dry run's crop. ``timeout=`` only bounds a wait (the lease)."""
    import feedfast

    if ctx.cuda:
        return feedfast.DataLoader(spec, shards=need_shards(ctx), batch_size=batch, device="cuda",
                                   timeout=ctx.sizes.loader_timeout, **asked)
    return feedfast.DataLoader(spec, shards=need_shards(ctx), batch_size=batch, device="cpu", placement="cpu",
                               backend="dali", overrides=ctx.overrides, timeout=ctx.sizes.loader_timeout)


def default_call(ctx: Context, batch: int, spec: str = DEFAULT_SPEC) -> str:
    """The call :func:`default_loader` makes, in words for a row."""
    if ctx.cuda:
        return f'DataLoader("{spec}", batch_size={batch}, device="cuda")'
    return f'DataLoader("{spec}", batch_size={batch}, device="cpu", placement="cpu", backend="dali") (dry run)'


def ran_as_default(ctx: Context, loader: Any) -> None:
    """On a GPU the default call must have run DALI GPU-placed (the README's promise; what the rows compare)."""
    want = ("dali", "gpu") if ctx.cuda else ("dali", "cpu")
    if (loader.backend, loader.plan.placement) != want:
        raise CheckFailed(f"the default call ran {loader.backend} {loader.plan.placement}-placed, not "
                          f"{want[0]} {want[1]}-placed")
