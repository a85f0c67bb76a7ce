"""The baselines feedfast is compared against, and how the comparison alternates.

- :mod:`~feedfast.baseline.torch_recipe`: torchvision's own ImageNet transforms in a
  ``torch.utils.data.DataLoader`` over the same shards (torchvision: the ``compare`` extra).
- :mod:`~feedfast.baseline.dali_recipe`: a hand-written DALI pipeline built from a plan's
  parameters, as a DALI user would write it.
- :mod:`~feedfast.baseline.rounds`: the order of alternating rounds and the spread of ratios.
- :mod:`~feedfast.baseline.timing`: one timed round of a newly built loader, closed at its end
  (``feedfast bench --compare`` and ``make bench`` both time their rounds with it).

feedfast's own PIL forms of the geometry ops (used by the ``pil`` and ``threads`` backends) live
beside the ops they implement, in :mod:`feedfast.ops.pil_ops`; no baseline uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from feedfast.baseline.torch_recipe import IMAGENET_MEAN, IMAGENET_STD, TorchRecipe, make_torch_loader

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "TorchRecipe", "make_torch_loader"]


def __getattr__(name: str) -> object:
    """The torchvision recipe's names, imported when first used (it needs torch; the rounds and the timing do
    not, nor does the CLI's parser)."""
    if name not in __all__:
        raise AttributeError(f"module 'feedfast.baseline' has no attribute {name!r}")
    from feedfast.baseline import torch_recipe

    return getattr(torch_recipe, name)
