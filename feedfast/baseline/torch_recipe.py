"""The torchvision ImageNet recipe on WebDataset shards: the baseline feedfast is measured against.

The transforms are torchvision's own (``torchvision.transforms``, built as its reference
training scripts build them, ``references/classification/presets.py``), never feedfast's
re-implementation. The images come from a map-style dataset that reads the shards through
feedfast's indexes (:class:`feedfast.baseline.shard_dataset.ShardSamples`), and a
``torch.utils.data.DataLoader`` with ``num_workers`` persistent worker processes batches them.

Batches, for N samples in batches of B (every sample exactly once per epoch): the sampler
hands whole batches of indices to the workers in turn, so every batch holds B samples but
the last, which holds ``N % B`` when that is not 0. With 7 samples and B = 2 an epoch is
``[0, 1] [2, 3] [4, 5] [6]`` (``shuffle=False``), whatever the number of workers.

Randomness: inside a DataLoader worker the transforms draw from torch's global generator,
which the DataLoader seeds per worker from its own seeded generator, as in any torch job;
in-process (``num_workers=0``) they draw from a private generator seeded with ``seed``, so
the caller's global torch RNG is left alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.utils.data
from PIL import Image

from feedfast.baseline.shard_dataset import ShardSamples
from feedfast.baseline.vision import transforms
from feedfast.errors import UserError

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
"""Per-channel mean of ImageNet RGB in [0, 1], as in the torchvision recipe."""

IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
"""Per-channel standard deviation of ImageNet RGB in [0, 1]."""


def _fail(name: str, value: object, rule: str, fix: str) -> NoReturn:
    """Raise a ``UserError`` naming the setting, the value, the rule and the fix."""
    raise UserError(f"{name} must be {rule}, got {value!r}; {fix}")


def _positive_int(name: str, value: object, example: int) -> None:
    """Raise ``UserError`` unless ``value`` is an int >= 1."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        _fail(name, value, "an int >= 1", f"pass e.g. {name}={example}")


@dataclass(frozen=True)
class TorchRecipe:
    """The torchvision ImageNet transforms, train or val, checked on construction.

    Train: ``RandomResizedCrop(size, scale, ratio, bilinear, antialias=True)``,
    ``RandomHorizontalFlip(flip_p)`` (left out when ``flip_p`` is 0), ``TrivialAugmentWide(bilinear)``
    when ``trivial_augment`` (as torchvision's reference presets put it), ``PILToTensor()``,
    ``ConvertImageDtype(torch.float)``, ``Normalize(mean, std)``, then ``RandomErasing(random_erasing)``
    when it is above 0. Val: ``Resize(resize)``, ``CenterCrop(size)``, then the same three.
    """

    train: bool = True
    size: int = 224
    resize: int = 256
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip_p: float = 0.5
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    trivial_augment: bool = False
    random_erasing: float = 0.0

    def __post_init__(self) -> None:
        _positive_int("size", self.size, 224)
        _positive_int("resize", self.resize, 256)
        pairs = (("scale", self.scale, "(0.08, 1.0)"), ("ratio", self.ratio, "(3/4, 4/3)"))
        for name, pair, example in pairs:
            if len(pair) != 2 or not 0 < pair[0] <= pair[1]:
                _fail(name, pair, "a pair (lo, hi) with 0 < lo <= hi", f"pass e.g. {name}={example}")
        if not 0.0 <= self.flip_p <= 1.0:
            _fail("flip_p", self.flip_p, "in [0, 1]", "pass e.g. flip_p=0.5")
        if len(self.mean) != 3 or len(self.std) != 3 or 0 in self.std:
            _fail("mean/std", (self.mean, self.std), "3 values each, std non-zero", "pass per-RGB-channel stats")

    def compose(self) -> Any:
        """The torchvision ``Compose`` of this recipe.

        Raises:
            UserError: torchvision is not installed.
        """
        tv = transforms()
        bilinear = tv.InterpolationMode.BILINEAR
        if self.train:
            head = [tv.RandomResizedCrop(self.size, scale=self.scale, ratio=self.ratio, interpolation=bilinear,
                                         antialias=True)]
            head += [tv.RandomHorizontalFlip(self.flip_p)] if self.flip_p > 0 else []
            head += [tv.TrivialAugmentWide(interpolation=bilinear)] if self.trivial_augment else []
        else:
            head = [tv.Resize(self.resize, interpolation=bilinear, antialias=True), tv.CenterCrop(self.size)]
        tail = [tv.PILToTensor(), tv.ConvertImageDtype(torch.float), tv.Normalize(self.mean, self.std)]
        tail += [tv.RandomErasing(p=self.random_erasing)] if self.train and self.random_erasing > 0 else []
        return tv.Compose(head + tail)

    def describe(self) -> list[str]:
        """torchvision's own description of each transform, in order."""
        return [repr(t) for t in self.compose().transforms]


class SeededTransform:
    """A torchvision transform that draws from a private generator when run outside a DataLoader worker.

    Picklable. In a worker it runs as is, on the worker's global generator (seeded by the
    DataLoader). In-process it swaps its own generator state in around each call, so that a
    seeded loader repeats itself without touching the caller's RNG.
    """

    def __init__(self, transform: Any, seed: int) -> None:
        self.transform = transform
        self._state = torch.Generator().manual_seed(seed).get_state()

    def __call__(self, img: Image.Image) -> torch.Tensor:
        if torch.utils.data.get_worker_info() is not None:
            return self.transform(img)
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._state)
            out = self.transform(img)
            self._state = torch.get_rng_state()
        return out


class MixupCutmixCollate:
    """torchvision's reference ``collate_fn`` under ``--mixup-alpha``/``--cutmix-alpha``: ``default_collate``,
    then ``v2.RandomChoice([MixUp(alpha), CutMix(alpha)])`` over the batch (soft targets out).

    A class, not the reference's lambda, so that worker processes can be handed it.
    """

    def __init__(self, mixup_alpha: float, cutmix_alpha: float, num_classes: int) -> None:
        from torchvision.transforms import v2

        self.mix = v2.RandomChoice([v2.MixUp(alpha=mixup_alpha, num_classes=num_classes),
                                    v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes)])

    def __call__(self, batch: list[Any]) -> Any:
        return self.mix(*torch.utils.data.default_collate(batch))


def make_torch_loader(
    shards: Sequence[str | os.PathLike[str]],
    *,
    batch_size: int,
    num_workers: int,
    train: bool = True,
    size: int = 224,
    resize: int = 256,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
    flip_p: float = 0.5,
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
    seed: int = 0,
    pin_memory: bool | None = None,
    shuffle: bool = False,
    index_paths: Sequence[str] | None = None,
    image_ext: str = "jpg;jpeg;png",
    label_ext: str = "cls",
    trivial_augment: bool = False,
    random_erasing: float = 0.0,
    mixup_cutmix: MixupCutmixCollate | None = None,
) -> torch.utils.data.DataLoader:
    """Build the torchvision recipe's DataLoader over local tar shards.

    Args:
        shards: local tar shard paths, at least one, read in this order.
        batch_size: samples per batch, >= 1; only an epoch's last batch may be smaller.
        num_workers: DataLoader worker processes (persistent); 0 runs in-process.
        train: train recipe if true, val recipe otherwise (see :class:`TorchRecipe`).
        size: output side length.
        resize: val only: shorter side before the centre crop.
        scale: train only: RandomResizedCrop area bounds.
        ratio: train only: RandomResizedCrop aspect-ratio bounds.
        flip_p: train only: horizontal flip probability.
        mean: normalisation mean per RGB channel.
        std: normalisation standard deviation per RGB channel.
        seed: seed of the loader's generator (shuffle, worker seeds) and of the in-process RNG, >= 0.
        pin_memory: pin batches; None pins only when CUDA is available.
        shuffle: a new permutation of the samples every epoch (the reference recipe's sampler).
        index_paths: the shards' index files, one each (feedfast's, e.g. ``loader.shards.index_paths``);
            None builds or reuses each shard's own.
        image_ext: ``;``-separated image extensions.
        label_ext: the label's extension.
        trivial_augment: train only: torchvision's ``TrivialAugmentWide`` after the flip.
        random_erasing: train only: ``RandomErasing``'s probability after ``Normalize`` (0: none).
        mixup_cutmix: the batch mix of torchvision's reference as the loader's ``collate_fn`` (None: none).

    Returns:
        A DataLoader yielding ``[images, labels]``: float32 ``(B, 3, size, size)`` and int64 ``(B,)``.

    Raises:
        UserError: an argument is invalid, or torchvision is not installed.
    """
    if isinstance(shards, (str, bytes)) or len(shards) == 0:
        _fail("shards", shards, "a non-empty list of tar paths", "pass e.g. ['train-0000.tar']")
    _positive_int("batch_size", batch_size, 256)
    for name, value in (("num_workers", num_workers), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            _fail(name, value, "an int >= 0", f"pass e.g. {name}=0")
    recipe = TorchRecipe(train=train, size=size, resize=resize, scale=(scale[0], scale[1]),
                         ratio=(ratio[0], ratio[1]), flip_p=flip_p, mean=tuple(mean), std=tuple(std),
                         trivial_augment=trivial_augment, random_erasing=random_erasing)
    dataset = ShardSamples([os.fspath(s) for s in shards], index_paths,
                           image_exts=frozenset(e.lower() for e in image_ext.split(";")), label_ext=label_ext,
                           transform=SeededTransform(recipe.compose(), seed))
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        persistent_workers=num_workers > 0,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=mixup_cutmix,
    )
