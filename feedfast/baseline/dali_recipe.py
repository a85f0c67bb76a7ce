"""A hand-written DALI pipeline for the same recipe: the other baseline of ``bench --compare``.

Written as a DALI user writes it from DALI's own examples, with the recipe's parameters:

- train: ``fn.readers.webdataset`` (feedfast's index files) -> ``fn.decoders.image_random_crop``
  (``random_area=scale``, ``random_aspect_ratio=ratio``) -> ``fn.resize`` to ``size x size`` ->
  ``fn.crop_mirror_normalize`` (``mirror`` from ``fn.random.coin_flip(flip_p)``, CHW float);
- val: ``fn.decoders.image`` -> ``fn.resize(resize_shorter=resize)`` ->
  ``fn.crop_mirror_normalize(crop=(size, size))``;

in a ``DALIGenericIterator`` with ``reader_name`` and the PARTIAL last-batch policy, so an
epoch delivers every sample once and its last batch holds the remainder. Decoding is
``mixed`` (nvJPEG) and the rest on the GPU when ``device_id`` is given, all on the CPU when
it is None. Labels (ASCII ``.cls`` bytes) leave DALI zero-padded to ``LABEL_BYTES`` and are
parsed on the host, vectorized over the batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from feedfast.baseline.torch_recipe import TorchRecipe
from feedfast.errors import UserError

LABEL_BYTES = 16
"""Room for the label's ASCII digits (and a trailing newline) in the padded label output."""

READER = "reader"


def ascii_labels(raw: torch.Tensor) -> torch.Tensor:
    """Decimal labels from zero-padded ASCII rows: ``[[b"4", b"2", 0, ...]] -> [42]`` (non-digits are skipped)."""
    digits = raw.to(torch.int64) - ord("0")
    is_digit = (digits >= 0) & (digits <= 9)
    value = torch.zeros(raw.shape[0], dtype=torch.int64, device=raw.device)
    for column in range(raw.shape[1]):
        value = torch.where(is_digit[:, column], value * 10 + digits[:, column], value)
    return value


def dali_iterator() -> tuple[Any, Any]:
    """DALI's ``DALIGenericIterator`` and ``LastBatchPolicy``.

    Raises:
        UserError: DALI is not installed.
    """
    try:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError as exc:
        raise UserError("--compare dali needs NVIDIA DALI: pip install 'feedfast[cuda12]'") from exc
    return DALIGenericIterator, LastBatchPolicy


class DaliRecipeLoader:
    """``for images, labels in loader``: one epoch per iteration, epoch after epoch.

    Args:
        shards: local tar paths.
        index_paths: their index files, one each.
        recipe: the transforms' parameters (:class:`TorchRecipe`).
        batch_size: samples per batch.
        threads: DALI CPU threads.
        device_id: the GPU to decode and augment on; None runs the whole pipeline on the CPU.
        seed: the pipeline's seed.
        shuffle: shuffle samples in the reader's buffer (``random_shuffle``).
        image_ext: ``;``-separated image extensions.
        label_ext: the label's extension.
    """

    def __init__(self, shards: Sequence[str], index_paths: Sequence[str], *, recipe: TorchRecipe, batch_size: int,
                 threads: int, device_id: int | None, seed: int = 0, shuffle: bool = False,
                 image_ext: str = "jpg;jpeg;png", label_ext: str = "cls") -> None:
        generic_iterator, last_batch_policy = dali_iterator()
        pipe = _pipeline(list(shards), list(index_paths), recipe, exts=[image_ext, label_ext], shuffle=shuffle,
                         batch_size=batch_size, num_threads=threads, device_id=device_id, seed=seed)
        self._iterator = generic_iterator([pipe], ["images", "labels"], reader_name=READER,
                                          last_batch_policy=last_batch_policy.PARTIAL, auto_reset=True)

    def __len__(self) -> int:
        return len(self._iterator)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for outputs in self._iterator:
            batch = outputs[0]
            yield batch["images"], ascii_labels(batch["labels"])


def recipe_images(encoded: Any, recipe: TorchRecipe, *, gpu: bool) -> Any:
    """The recipe's transforms as DALI ops on encoded images (inside a pipeline's definition): a random-crop
    decode, resize, flip and normalize to CHW float (train), or decode, shorter-side resize and center crop;
    decoded with nvJPEG and augmented on the GPU where ``gpu``. A hand-written pipeline over any reader uses it."""
    from nvidia.dali import fn, types

    decoder, device = ("mixed", "gpu") if gpu else ("cpu", "cpu")
    mean = [255.0 * m for m in recipe.mean]
    std = [255.0 * s for s in recipe.std]
    if recipe.train:
        images = fn.decoders.image_random_crop(encoded, device=decoder, output_type=types.RGB,
                                               random_area=list(recipe.scale),
                                               random_aspect_ratio=list(recipe.ratio), num_attempts=10)
        images = fn.resize(images, device=device, resize_x=recipe.size, resize_y=recipe.size,
                           interp_type=types.INTERP_LINEAR, antialias=True)
        mirror = fn.random.coin_flip(probability=recipe.flip_p)
        return fn.crop_mirror_normalize(images, device=device, dtype=types.FLOAT, output_layout="CHW",
                                        mean=mean, std=std, mirror=mirror)
    images = fn.decoders.image(encoded, device=decoder, output_type=types.RGB)
    images = fn.resize(images, device=device, resize_shorter=recipe.resize, interp_type=types.INTERP_LINEAR,
                       antialias=True)
    return fn.crop_mirror_normalize(images, device=device, dtype=types.FLOAT, output_layout="CHW",
                                    crop=(recipe.size, recipe.size), mean=mean, std=std)


def _pipeline(paths: list[str], index_paths: list[str], recipe: TorchRecipe, *, exts: list[str], shuffle: bool,
              **pipeline_args: Any) -> Any:
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(**pipeline_args)
    def recipe_pipeline() -> Any:
        encoded, raw_labels = fn.readers.webdataset(
            paths=paths, index_paths=index_paths, ext=exts, missing_component_behavior="error",
            case_sensitive_extensions=False, random_shuffle=shuffle, initial_fill=1024 if shuffle else 1,
            pad_last_batch=True, name=READER)
        images = recipe_images(encoded, recipe, gpu=pipeline_args["device_id"] is not None)
        labels = fn.pad(raw_labels, axes=(0,), shape=(LABEL_BYTES,), fill_value=0)
        return images, labels

    pipe = recipe_pipeline()
    pipe.build()
    return pipe
