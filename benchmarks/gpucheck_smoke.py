"""``gpu_check.py``'s correctness steps: the README's default call, and whole epochs with host syncs forbidden."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from gpucheck_common import SPEC, CheckFailed, Context, Section, Skip, one_line
from gpucheck_sections import need_shards, synchronizer

README_SPEC = "pipelines/imagenet-train.yaml"
"""The spec exactly as the README's one-line swap names it (a shipped name, found from any folder)."""


def expected_device() -> torch.device:
    """Where a call without ``device=`` must deliver: the current CUDA device when torch sees one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---------------------------------------------------------------------------- README's call
def readme_default_section(ctx: Context, sec: Section) -> None:
    """``feedfast.DataLoader("pipelines/imagenet-train.yaml", shards=..., batch_size=64)``, nothing else.

    On a machine with CUDA (dry run or not) the batches must be CUDA tensors on the current
    device and the plan GPU-placed; without CUDA, CPU tensors from a CPU plan.
    """
    import feedfast

    started = time.perf_counter()
    # the README's call; timeout= only bounds the wait (a hang must not lose the lease), it changes nothing else
    loader = feedfast.DataLoader(README_SPEC, shards=need_shards(ctx), batch_size=64, timeout=ctx.sizes.loader_timeout)
    try:
        images, labels = next(iter(loader))
        synchronizer(images.is_cuda)()
        first = time.perf_counter() - started
    finally:
        loader.close()
    want = expected_device()
    placement = loader.plan.placement
    sec.add_feed("", samples_per_s=None, stall=None, gpu_util=None, first_batch_s=first,
                 note=f"image {tuple(images.shape)} {images.dtype} on {images.device}, label {labels.dtype} on "
                      f"{labels.device}; plan {placement}-placed; no device= or placement= given")
    sec.data.update(device=str(images.device), label_device=str(labels.device), placement=placement,
                    shape=list(images.shape), first_batch_s=first)
    if images.device != want or labels.device != want:
        raise CheckFailed(f"the README's call delivered {images.device}/{labels.device}, expected {want}")
    if placement != ("gpu" if want.type == "cuda" else "cpu"):
        raise CheckFailed(f"the README's call planned {placement}-placed with {want} available")


# ---------------------------------------------------------------------------- sync debug
@contextmanager
def host_syncs_forbidden(cuda: bool) -> Iterator[None]:
    """``torch.cuda.set_sync_debug_mode("error")`` inside (any host sync raises); nothing without CUDA."""
    if not cuda:
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def epoch_without_syncs(ctx: Context, placement: str, device: str) -> tuple[int, int, str | None]:
    """One whole epoch (first batch to the end) with host syncs forbidden; batches, expected, error.

    Each batch is consumed on its device without reading anything back, as a training step does.
    """
    import feedfast

    loader = feedfast.DataLoader(SPEC, shards=need_shards(ctx), batch_size=ctx.sizes.batch, placement=placement,
                                 device=device, overrides=ctx.overrides, timeout=ctx.sizes.loader_timeout)
    batches, error, total = 0, None, torch.zeros((), device=device)
    try:
        with host_syncs_forbidden(ctx.cuda):
            for images, labels in loader:
                total += images.float().mean() + labels.sum()
                batches += 1
                ctx.budget.check()
        synchronizer(ctx.cuda)()  # outside the mode: surfaces asynchronous errors of the epoch
    except RuntimeError as exc:  # what sync debug mode raises (and any loader failure, named)
        error = one_line(exc)
    finally:
        loader.close()
    return batches, len(loader), error


def sync_debug_section(ctx: Context, sec: Section) -> None:
    """Both CUDA paths (CPU-placed -> cuda, GPU-placed) for one epoch each under sync debug mode "error"."""
    paths = (("cpu", "cuda"), ("gpu", "cuda")) if ctx.cuda else (("cpu", "cpu"),)
    failures = []
    for placement, device in paths:
        batches, expected, error = epoch_without_syncs(ctx, placement, device)
        ok = error is None and batches == expected
        verdict = ("pass" if ctx.cuda else "ran") if ok else "FAIL"
        note = error or f"{batches} of {expected} batches" + ("" if ok else ": the epoch ended early")
        sec.add(f"{placement}-placed -> {device}, one epoch", verdict, "", note)
        sec.data[f"{placement}_{device}"] = {"verdict": verdict, "batches": batches, "expected": expected,
                                             "error": error}
        if not ok:
            failures.append(f"{placement}-placed -> {device}: {note}")
    if failures:
        raise CheckFailed("; ".join(failures))
    if not ctx.cuda:
        raise Skip("sync debug mode needs CUDA (dry run): the epoch loop ran on the CPU, host syncs unchecked")
