"""``feedfast.Mixup``: the batch mix as an object a user calls, as timm users call ``mixup_fn(x, y)``.

For the batch hook (``collate_fn=``, :mod:`feedfast.loader.batchhook`) or any training loop::

    mixup = feedfast.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=1000)
    loader = feedfast.DataLoader(spec, shards=..., collate_fn=mixup)   # (image, label) batches
    x, soft = mixup(x, y)                                              # or by hand, timm's call

Its knobs and results are those of the spec's ``batch.mix`` (:mod:`feedfast.ops.batchmix`), on
the tensors' device. Its draws are its own: a counter-based generator keyed by ``seed`` and the
number of batches it has mixed (:meth:`state_dict` holds it). The loader makes batches ahead, so
a hook's count runs ahead of the training step; for mixing that resumes exactly with the
loader's state, put the mix in the spec (``batch.mix``), whose draws are keyed by the epoch and step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from feedfast.errors import UserError
from feedfast.ops.batchmix import draw_params, mix_images, soft_targets
from feedfast.order.draws import batch_generator
from feedfast.spec.batchmix_settings import MixSettings, problem


class Mixup:
    """timm's ``Mixup`` arguments (``num_classes`` required), plus ``convention``, ``layout`` and ``seed``.

    Args:
        layout: the images' layout, ``CHW`` (``[B, C, H, W]``, torch's) or ``HWC`` (``[B, H, W, C]``).
        seed: keys the draws (with the count of batches mixed).

    Raises:
        UserError: a bad setting (its name, the value and what is allowed).
    """

    def __init__(self, *, num_classes: int, mixup_alpha: float = 1.0, cutmix_alpha: float = 0.0,
                 cutmix_minmax: tuple[float, float] | list[float] | None = None, prob: float = 1.0,
                 switch_prob: float = 0.5, mode: str = "batch", correct_lam: bool = True,
                 label_smoothing: float = 0.1, convention: str = "timm", layout: str = "CHW", seed: int = 0) -> None:
        minmax: Any = tuple(cutmix_minmax) if isinstance(cutmix_minmax, (list, tuple)) else cutmix_minmax
        self.settings = MixSettings(num_classes=num_classes, mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha,
                                    cutmix_minmax=minmax, prob=prob, switch_prob=switch_prob, mode=mode,
                                    correct_lam=correct_lam, label_smoothing=label_smoothing, convention=convention)
        bad = problem(self.settings)
        if bad is not None:
            raise UserError(f"Mixup({bad[0]}={bad[1]!r}): allowed: {bad[2]}")
        if layout not in ("CHW", "HWC"):
            raise UserError(f"Mixup(layout={layout!r}): allowed: 'CHW' ([B, C, H, W]) or 'HWC' ([B, H, W, C])")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise UserError(f"Mixup(seed={seed!r}): allowed: an integer")
        self.layout, self.seed, self.calls = layout, seed, 0
        self.mixup_enabled = True
        """timm's switch: False mixes nothing (the targets are each sample's smoothed one-hot)."""

    def __call__(self, x: Any, target: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mixed images, soft targets [B, num_classes])`` of ``(x, target)``, or of a batch ``(x, target)``.

        Raises:
            UserError: not a batch of 4-d images and 1-d labels, or labels outside ``[0, num_classes)``.
        """
        if target is None:
            if not (isinstance(x, (tuple, list)) and len(x) == 2):
                raise UserError("Mixup takes (images, labels), or one batch that is that pair; got "
                                f"{type(x).__name__}{f' of {len(x)}' if isinstance(x, (tuple, list)) else ''}")
            x, target = x
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not isinstance(target, torch.Tensor):
            raise UserError(f"Mixup needs a 4-d image batch and a label tensor, got {type(x).__name__} "
                            f"{tuple(getattr(x, 'shape', ()))} and {type(target).__name__}")
        if target.reshape(-1).shape[0] != x.shape[0]:
            raise UserError(f"Mixup: {x.shape[0]} images and {target.numel()} labels")
        h, w = (x.shape[2], x.shape[3]) if self.layout == "CHW" else (x.shape[1], x.shape[2])
        params = draw_params(self.settings, batch_generator("mixup", self.seed, self.calls), x.shape[0], h, w,
                             enabled=self.mixup_enabled)
        self.calls += 1
        try:
            soft = soft_targets(target, params, self.settings.num_classes, self.settings.label_smoothing)
        except ValueError as exc:
            raise UserError(f"Mixup: {exc}") from exc
        return mix_images(_own_copy(x), params, self.layout, inplace=True), soft

    def state_dict(self) -> dict[str, int]:
        """The batches mixed so far (with ``seed``, what the next draws depend on)."""
        return {"seed": self.seed, "calls": self.calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the draws from a :meth:`state_dict`."""
        self.seed, self.calls = int(state["seed"]), int(state["calls"])

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self.settings, f.name)!r}" for f in dataclasses.fields(self.settings)
                           if f.name not in ("image", "label"))
        return f"Mixup({fields}, layout={self.layout!r}, seed={self.seed})"


def _own_copy(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` to mix in place (the caller's tensor stays as it was). On the CPU a NumPy copy in this
    thread, so that neither the copy nor the mix (:func:`feedfast.ops.batchmix.mix_images` in place: the C
    extension) runs on torch's thread pool, against the loader's decoding threads when this is its batch hook."""
    if x.device.type == "cpu" and x.is_contiguous() and not x.requires_grad:
        return torch.from_numpy(x.numpy().copy())
    return x.clone()
