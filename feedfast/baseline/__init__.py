"""The torchvision-style baseline: webdataset + PIL + torchvision transforms + DataLoader.

torchvision itself is not a dependency; :mod:`feedfast.baseline.pil_ops` re-implements the
transforms the ImageNet recipe uses, with torchvision's semantics.
"""

from feedfast.baseline.torch_recipe import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TorchRecipe,
    make_torch_loader,
)

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "TorchRecipe", "make_torch_loader"]
