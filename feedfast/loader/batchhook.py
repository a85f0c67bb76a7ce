"""The batch hook: a user's function over each finished batch, run on the loader's producer thread.

feedfast batches samples itself, so ``collate_fn=`` cannot be torch's per-sample collate (a
function of a list of samples): it is a function of the finished batch, the tuple or dict the
loader would yield, returning the batch to yield instead (timm's mixup, for instance:
``collate_fn=lambda batch: mixup_fn(*batch)``). It runs ahead of the training step on the
producer thread; with a CUDA delivery device, on the loader's side stream after the batch's
copy, and the training stream waits for an event recorded after the hook's work
(:class:`~feedfast.loader.deliver.Delivery` runs it). Its randomness is its own: it runs on another thread than the
training loop, so a hook that wants reproducible draws keeps its own generator.

torch's own collates (``default_collate``, torch's default, and ``default_convert``) mean no hook:
the loader's batches are already what they would make of its samples, so a script that passes
torch's default along works unchanged. Each result of a hook is checked: a hook keeps the batch's samples (every
tensor it returns has the batch's size as its first dimension), because the loader's counts,
padding, ``sample_info`` and state describe them. A torch-style collate given the finished
batch by mistake fails that check, or raises, and either way the error says what it receives.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch.utils.data import default_collate, default_convert

from feedfast.errors import FeedfastError, UserError
from feedfast.loader.batch import BatchInfo

BatchHook = Callable[[Any], Any]

_TORCH_COLLATES = (default_collate, default_convert)
"""What a torch DataLoader does by default (batching, converting): the loader's batches already are that."""


def check_batch_hook(fn: Any) -> BatchHook | None:
    """``collate_fn=``: None, or a callable of the finished batch; torch's own collates mean None (no hook)."""
    if fn is None or fn in _TORCH_COLLATES:
        return None
    if not callable(fn):
        raise UserError(f"collate_fn must be a function of the finished batch, got {fn!r}")
    return fn  # type: ignore[no-any-return]


def tensors_of(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside a batch: a tensor, or tuples, lists and dicts of them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_of(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_of(item)


def run_batch_hook(fn: BatchHook, batch: Any, size: int, where: str) -> Any:
    """``fn(batch)``, checked: its failures name the batch, and it must keep the batch's ``size`` samples.

    Raises:
        FeedfastError: ``fn`` raised (chained), or returned a tensor whose first dimension is not ``size``.
    """
    try:
        out = fn(batch)
    except Exception as exc:
        raise FeedfastError(f"collate_fn raised {type(exc).__name__}: {exc} ({where}); feedfast's collate_fn "
                            "receives the finished batch (the tuple or dict of batched tensors the loader yields), "
                            "not torch's list of samples") from exc
    for tensor in tensors_of(out):
        if tensor.dim() >= 1 and tensor.shape[0] != size:
            raise FeedfastError(f"collate_fn returned a tensor of shape {tuple(tensor.shape)} for a batch of {size} "
                                f"samples ({where}): it must keep the batch's samples (first dimension {size}); "
                                "a torch-style collate_fn, a function of a list of samples, does not fit here: "
                                "feedfast's receives the finished batch")
    return out


def with_info(batch: Any, info: BatchInfo | None) -> Any:
    """A hooked batch with its ``sample_info`` added as the loader adds it: last of a tuple, a key of a dict."""
    if info is None:
        return batch
    if isinstance(batch, dict):
        return {**batch, "sample_info": info}
    return (*batch, info) if isinstance(batch, (tuple, list)) else (batch, info)
