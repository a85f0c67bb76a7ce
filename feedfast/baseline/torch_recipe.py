"""The standard torchvision ImageNet recipe on WebDataset shards, as users write it.

``webdataset.WebDataset`` reads the tars, ``.decode("pil")`` decodes with PIL, the
torchvision transforms (re-implemented in :mod:`feedfast.baseline.pil_ops`) run per sample,
and a ``torch.utils.data.DataLoader`` with ``num_workers`` processes batches the result.
This is the baseline feedfast is measured against.

Worker split, for S shards and W workers (every sample delivered exactly once per epoch):

==========  =======================================================================
``W <= 1``  one process reads every shard in order.
``S >= W``  webdataset's ``split_by_worker``: worker ``k`` reads shards ``k, k+W, ...``.
``S < W``   ``split_by_worker`` would leave ``W - S`` workers idle (and webdataset
            would raise for their empty stream), so every worker reads every shard
            and keeps samples ``k, k+W, ...``; tar reading is repeated W times but
            decoding and transforms are not.
==========  =======================================================================

Each worker yields its own batches, so an epoch may end with up to W partial batches.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.utils.data
import webdataset as wds
from PIL import Image

from feedfast.baseline import pil_ops
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
    """The torchvision ImageNet transforms, train or val.

    Train: ``RandomResizedCrop(size, scale, ratio)``, ``RandomHorizontalFlip(flip_p)``,
    ``ToTensor()``, ``Normalize(mean, std)``. Val: ``Resize(resize)``,
    ``CenterCrop(size)``, ``ToTensor()``, ``Normalize(mean, std)``. Settings are checked
    on construction.
    """

    train: bool = True
    size: int = 224
    resize: int = 256
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip_p: float = 0.5
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: Image.Resampling = Image.BILINEAR

    def __post_init__(self) -> None:
        _positive_int("size", self.size, 224)
        _positive_int("resize", self.resize, 256)
        pairs = (("scale", self.scale, "(0.08, 1.0)"), ("ratio", self.ratio, "(3/4, 4/3)"))
        for name, pair, example in pairs:
            if len(pair) != 2 or not 0 < pair[0] <= pair[1]:
                rule = "a pair (lo, hi) with 0 < lo <= hi"
                _fail(name, pair, rule, f"pass e.g. {name}={example}")
        if not 0.0 <= self.flip_p <= 1.0:
            _fail("flip_p", self.flip_p, "in [0, 1]", "pass e.g. flip_p=0.5")
        if len(self.mean) != 3 or len(self.std) != 3 or 0 in self.std:
            rule = "3 values each, std non-zero"
            _fail("mean/std", (self.mean, self.std), rule, "pass per-RGB-channel stats")

    def describe(self) -> list[str]:
        """The equivalent torchvision transforms, one string each, in order.

        Returns:
            For example ``["RandomResizedCrop(224, scale=(0.08, 1.0), ...)", ...]``.
        """
        head = (
            [
                f"RandomResizedCrop({self.size}, scale={self.scale}, ratio={self.ratio})",
                f"RandomHorizontalFlip(p={self.flip_p})",
            ]
            if self.train
            else [f"Resize({self.resize})", f"CenterCrop({self.size})"]
        )
        return head + ["ToTensor()", f"Normalize(mean={self.mean}, std={self.std})"]

    def apply(self, img: Image.Image, rng: random.Random) -> torch.Tensor:
        """Run the recipe on one image.

        Args:
            img: RGB input image.
            rng: Source of randomness for the train crop and flip (unused for val).

        Returns:
            A normalised float32 tensor ``(3, size, size)``.
        """
        if self.train:
            out = pil_ops.random_resized_crop(
                img, self.size, self.scale, self.ratio, rng=rng, interpolation=self.interpolation
            )
            if rng.random() < self.flip_p:
                out = pil_ops.hflip(out)
        else:
            resized = pil_ops.resize_shorter(img, self.resize, self.interpolation)
            out = pil_ops.center_crop(resized, self.size)
        return pil_ops.normalize(pil_ops.to_tensor(out), self.mean, self.std)


class RecipeTransform:
    """Picklable per-sample transform with its own RNG in each DataLoader worker.

    The RNG is made on first use: from ``seed`` in-process, or from the worker's
    ``torch.utils.data.get_worker_info().seed`` (distinct per worker and per epoch, and
    reproducible because the loader's generator is seeded).
    """

    def __init__(self, recipe: TorchRecipe, seed: int) -> None:
        self.recipe = recipe
        self.seed = seed
        self._rng: random.Random | None = None

    def __call__(self, img: Image.Image) -> torch.Tensor:
        if self._rng is None:
            info = torch.utils.data.get_worker_info()
            self._rng = random.Random(self.seed if info is None else info.seed)
        return self.recipe.apply(img, self._rng)


def split_samples_by_worker(samples: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Keep samples ``k, k+W, ...`` in DataLoader worker ``k`` of ``W``; all samples in-process.

    Args:
        samples: The full sample stream, identical in every worker.

    Yields:
        This worker's share of the samples.
    """
    info = torch.utils.data.get_worker_info()
    worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
    for index, sample in enumerate(samples):
        if index % workers == worker:
            yield sample


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
) -> torch.utils.data.DataLoader:
    """Build the standard webdataset + PIL + torchvision-transforms + DataLoader pipeline.

    Shards are read in the given order (no shuffling) on a single node; the module
    docstring tables how shards and samples are split across workers. Workers are not
    persistent.

    Args:
        shards: Tar shard paths, at least one.
        batch_size: Samples per batch, >= 1; the last batch of each worker may be smaller.
        num_workers: DataLoader worker processes; 0 runs in-process.
        train: Train recipe if true, val recipe otherwise (see :class:`TorchRecipe`).
        size: Output side length.
        resize: Val only: shorter side before the centre crop.
        scale: Train only: RandomResizedCrop area bounds.
        ratio: Train only: RandomResizedCrop aspect-ratio bounds.
        flip_p: Train only: horizontal flip probability.
        mean: Normalisation mean per RGB channel.
        std: Normalisation standard deviation per RGB channel.
        seed: Seed of the augmentation RNGs and the loader's generator, >= 0.
        pin_memory: Pin batches; ``None`` pins only when CUDA is available.

    Returns:
        A DataLoader yielding ``[images, labels]``: float32 ``(B, 3, size, size)`` and
        int64 ``(B,)``.

    Raises:
        UserError: If an argument is invalid.
    """
    if isinstance(shards, (str, bytes)) or len(shards) == 0:
        _fail("shards", shards, "a non-empty list of tar paths", "pass e.g. ['train-0000.tar']")
    _positive_int("batch_size", batch_size, 256)
    for name, value in (("num_workers", num_workers), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            _fail(name, value, "an int >= 0", f"pass e.g. {name}=0")
    recipe = TorchRecipe(
        train=train,
        size=size,
        resize=resize,
        scale=(scale[0], scale[1]),
        ratio=(ratio[0], ratio[1]),
        flip_p=flip_p,
        mean=tuple(mean),
        std=tuple(std),
    )
    urls = [os.fspath(shard) for shard in shards]
    split_samples = num_workers > len(urls)
    dataset = wds.WebDataset(
        urls,
        shardshuffle=False,
        nodesplitter=wds.single_node_only,
        workersplitter=None if split_samples else wds.split_by_worker,
        empty_check=not split_samples,
    )
    if split_samples:
        dataset = dataset.compose(split_samples_by_worker)
    transform = RecipeTransform(recipe, seed)
    dataset = dataset.decode("pil").to_tuple("jpg;jpeg;png", "cls").map_tuple(transform, int)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        persistent_workers=False,
        generator=torch.Generator().manual_seed(seed),
    )
