"""The contenders of ``make bench``: each a factory of an endless iterator of batches.

All read the same shards with the same number of CPU workers or threads and do the same
work per sample (imagenet-train: random resized crop to 224, horizontal flip, normalize
to CHW float32, int64 labels), except the decode-only ceiling.

Each round of a row builds its iterator anew and :func:`time_row_cpu` times and closes it with
:func:`feedfast.baseline.timing.time_round`, the function ``feedfast bench --compare`` times its
rounds with.

A factory raises :class:`RowUnavailable` when what its row needs is not installed (SPDL,
torchvision): ``make bench`` then leaves that row out and says why.
"""

from __future__ import annotations

import io
import itertools
import tarfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "pipelines" / "imagenet-train.yaml"
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


class RowUnavailable(RuntimeError):
    """A row cannot run here (a package it needs is missing); the message says how to get it."""


def _feedfast(shards: list[str], batch: int, workers: int, **options: Any) -> Iterator[Any]:
    """A feedfast loader's batches, epoch after epoch, as the CLI's comparison times them
    (:func:`feedfast.baseline.contenders.feedfast_contender`): ``delivered()`` leaves its padding
    out, ``close()`` stops its background work (a threads-backend loader starts its next epoch ahead)."""
    import feedfast
    from feedfast.baseline.contenders import feedfast_contender

    return feedfast_contender(feedfast.DataLoader(SPEC, shards=shards, batch_size=batch, num_workers=workers,
                                                  **options))


def feedfast_dali(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """feedfast.DataLoader on imagenet-train, DALI CPU."""
    return _feedfast(shards, batch, workers, placement="cpu", backend="dali")


def feedfast_pil(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """feedfast.DataLoader on imagenet-train, the portable PIL backend."""
    return _feedfast(shards, batch, workers, backend="pil")


def feedfast_threads(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """feedfast's threaded CPU path on imagenet-train: ``DataLoader(backend="threads")``."""
    return _feedfast(shards, batch, workers, backend="threads")


def torch_recipe(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """The torchvision DataLoader recipe (:func:`feedfast.baseline.make_torch_loader`): PIL decode from a
    map-style dataset over the shards, torchvision's RandomResizedCrop, flip, PILToTensor, ConvertImageDtype,
    Normalize, a torch DataLoader with ``workers`` persistent worker processes."""
    from feedfast.baseline.measure import forever
    from feedfast.baseline.torch_recipe import make_torch_loader
    from feedfast.errors import UserError

    try:
        loader = make_torch_loader(shards, batch_size=batch, num_workers=workers)
    except UserError as exc:  # no torchvision
        raise RowUnavailable(str(exc)) from exc
    return forever(loader)


def spdl_pipeline(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """Meta's SPDL thread pipeline running the torchvision recipe's own transforms.

    Built as SPDL's examples build it: its WebDataset example's stages (each shard read whole
    and split with ``spdl.io.iter_tarfile``, members grouped by key, ``disaggregate``), then,
    as in its ``multi_thread_preprocessing`` example, the PIL decode and the torchvision
    ``Compose`` (the same one as the torchvision recipe row: RandomResizedCrop 224 bilinear
    antialiased, flip, PILToTensor, ConvertImageDtype, Normalize) in a ``pipe`` stage with
    ``concurrency=workers``, ``aggregate(batch)``, a collate stage, ``build(num_threads=workers)``.
    Shards are read in order, round after round (the torchvision row does not shuffle either).
    """
    try:
        import spdl.io
        from spdl.pipeline import PipelineBuilder
    except ImportError as exc:
        raise RowUnavailable("SPDL is not installed: pip install spdl==0.8.0 (make bench installs it)") from exc
    from PIL import Image

    from feedfast.baseline.torch_recipe import TorchRecipe
    from feedfast.errors import UserError

    try:
        transform = TorchRecipe().compose()
    except UserError as exc:  # no torchvision
        raise RowUnavailable(str(exc)) from exc

    def shard_samples(path: str) -> list[tuple[bytes, bytes]]:
        with open(path, "rb") as f:
            data = f.read()
        members: dict[str, dict[str, bytes]] = {}
        for name, content in spdl.io.iter_tarfile(data):
            key, _, ext = name.rpartition(".")
            members.setdefault(key, {})[ext] = bytes(content)
        return [(m["jpg"], m["cls"]) for m in members.values() if "jpg" in m and "cls" in m]

    def decode_transform(sample: tuple[bytes, bytes]) -> tuple[torch.Tensor, int]:
        jpeg, label = sample
        with Image.open(io.BytesIO(jpeg)) as img:
            rgb = img.convert("RGB")
        return transform(rgb), int(label)

    def collate(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([image for image, _ in items]), torch.tensor([label for _, label in items])

    pipeline = (PipelineBuilder().add_source(itertools.cycle(shards)).pipe(shard_samples).disaggregate()
                .pipe(decode_transform, concurrency=workers).aggregate(batch).pipe(collate)
                .add_sink(2).build(num_threads=workers))

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        with pipeline.auto_stop():  # closing the generator stops the pipeline's threads
            yield from pipeline.get_iterator(timeout=300)

    return batches()


def hand_dali(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """The same pipeline written directly in DALI, as its docs teach (ROI decode, resize, cmn)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import feed_ndarray

    from feedfast.shards.index.tarindex import default_index_path

    @pipeline_def(batch_size=batch, num_threads=workers, device_id=None, seed=0)
    def pipe():  # type: ignore[no-untyped-def]
        jpegs, labels = fn.readers.webdataset(
            paths=shards, index_paths=[str(default_index_path(s)) for s in shards], ext=["jpg", "cls"],
            random_shuffle=True, initial_fill=1024, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4 / 3])
        images = fn.resize(images, size=[224, 224])
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=MEAN, std=STD,
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    p = pipe()
    p.build()
    while True:
        images, labels = p.run()
        out = torch.empty((batch, 3, 224, 224), dtype=torch.float32)
        feed_ndarray(images.as_tensor(), out)
        ys = torch.tensor([int(np.asarray(labels[i]).tobytes()) for i in range(len(labels))])
        yield out, ys


def pil_decode_only(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """PIL full decode of each JPEG in this one process: the per-core decode ceiling."""
    from PIL import Image

    blobs = []
    for s in shards:
        with tarfile.open(s) as t:
            blobs += [t.extractfile(m).read() for m in t if m.name.endswith(".jpg")]  # type: ignore[union-attr]
    i = 0
    while True:
        for _ in range(batch):
            Image.open(io.BytesIO(blobs[i % len(blobs)])).convert("RGB").load()
            i += 1
        yield (torch.empty(batch, 0),)


RECIPE_SPEC = ROOT / "pipelines" / "imagenet-train-recipe.yaml"
RECIPE_SIZE = 176


def feedfast_recipe_threads(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """feedfast's threaded CPU path on imagenet-train-recipe.yaml (crop 176, flip, TrivialAugmentWide,
    normalize, random erasing 0.1)."""
    import feedfast
    from feedfast.baseline.contenders import feedfast_contender

    return feedfast_contender(feedfast.DataLoader(RECIPE_SPEC, shards=shards, batch_size=batch, num_workers=workers,
                                                  backend="threads"))


def torch_recipe_trivial_augment(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """The torchvision DataLoader running the same torchvision transforms: RandomResizedCrop(176), flip,
    TrivialAugmentWide(bilinear), PILToTensor, ConvertImageDtype, Normalize, RandomErasing(0.1), and the
    recipe's batch mix as torchvision's reference collates it: RandomChoice([MixUp(0.2), CutMix(1.0)])."""
    from feedfast.baseline.measure import forever
    from feedfast.baseline.torch_recipe import MixupCutmixCollate, make_torch_loader
    from feedfast.errors import UserError

    try:
        loader = make_torch_loader(shards, batch_size=batch, num_workers=workers, size=RECIPE_SIZE,
                                   trivial_augment=True, random_erasing=0.1,
                                   mixup_cutmix=MixupCutmixCollate(0.2, 1.0, num_classes=1000))
    except UserError as exc:  # no torchvision
        raise RowUnavailable(str(exc)) from exc
    return forever(loader)


def hand_dali_auto_aug(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """The recipe written directly in DALI on the CPU, as its auto_aug docs teach: ROI decode, resize,
    flip, ``auto_aug.trivial_augment.trivial_augment_wide``, crop_mirror_normalize (no random erasing:
    DALI has no ready-made one)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import trivial_augment
    from nvidia.dali.plugin.pytorch import feed_ndarray

    from feedfast.shards.index.tarindex import default_index_path

    @pipeline_def(batch_size=batch, num_threads=workers, device_id=None, seed=0, enable_conditionals=True)
    def pipe():  # type: ignore[no-untyped-def]
        jpegs, labels = fn.readers.webdataset(
            paths=shards, index_paths=[str(default_index_path(s)) for s in shards], ext=["jpg", "cls"],
            random_shuffle=True, initial_fill=1024, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4 / 3])
        images = fn.resize(images, size=[RECIPE_SIZE, RECIPE_SIZE])
        images = fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5))
        images = trivial_augment.trivial_augment_wide(images)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=MEAN, std=STD)
        return images, labels

    p = pipe()
    p.build()
    while True:
        images, labels = p.run()
        out = torch.empty((batch, 3, RECIPE_SIZE, RECIPE_SIZE), dtype=torch.float32)
        feed_ndarray(images.as_tensor(), out)
        ys = torch.tensor([int(np.asarray(labels[i]).tobytes()) for i in range(len(labels))])
        yield out, ys


RECIPE_ROWS: dict[str, tuple[Callable[..., Iterator[Any]], str]] = {
    "feedfast threaded CPU, recipe": (feedfast_recipe_threads, "imagenet-train-recipe.yaml on the threaded path"),
    "torchvision recipe, TrivialAugmentWide": (torch_recipe_trivial_augment,
                                               "the same torchvision transforms and batch mix in a torch DataLoader"),
    "hand-written DALI auto_aug": (hand_dali_auto_aug, "DALI's trivial_augment_wide on the CPU, written by hand"),
}
"""The rows of the recipe set (issue 25 item 5)."""

ROWS: dict[str, tuple[Callable[..., Iterator[Any]], str]] = {
    "feedfast threaded CPU": (feedfast_threads, "feedfast's threaded CPU path (pillow-simd in threads)"),
    "feedfast DALI CPU": (feedfast_dali, "feedfast.DataLoader(imagenet-train.yaml), DALI on the CPU"),
    "hand-written DALI": (hand_dali, "the same graph written directly in DALI"),
    "torchvision recipe": (torch_recipe, "PIL + RandomResizedCrop/flip/ToTensor/Normalize, torch DataLoader"),
    "SPDL thread pipeline": (spdl_pipeline, "spdl.pipeline.PipelineBuilder running the same torchvision transforms"),
    "feedfast PIL backend": (feedfast_pil, "feedfast.DataLoader(..., backend='pil')"),
    "PIL decode only (1 core)": (pil_decode_only, "full PIL decode per image, one process: the per-core ceiling"),
}


def time_row(make: Callable[[], Iterator[Any]], *, warmup: int, batches: int) -> float:
    """Samples per second over ``batches`` batches after ``warmup``."""
    return time_row_cpu(make, warmup=warmup, batches=batches)[0]


def time_row_cpu(make: Callable[[], Iterator[Any]], *, warmup: int, batches: int) -> tuple[float, float]:
    """One round of a row built by ``make()`` and closed at the round's end: samples per second, and
    CPU milliseconds spent per sample (all threads and worker processes).

    The round is timed by :func:`feedfast.baseline.timing.time_round`, as ``feedfast bench
    --compare`` times its rounds: ``warmup`` batches untimed, then ``batches`` timed; samples
    are delivered samples (the row's ``delivered()`` where it has one: feedfast's loaders, whose
    padding it leaves out; else each batch's rows); CPU seconds are this process's and its
    children's over the timed batches. Only the round holds the row, so closing it and the
    collection after free what it held before the next round.

    On a machine shared with other work, wall-clock rates swing with the others' load; the
    CPU cost per sample does much less, and ``cores / cost`` is the rate a quiet machine
    would reach if the row keeps its cores busy.
    """
    from feedfast.baseline.measure import RunPlan
    from feedfast.baseline.timing import time_round

    figs, _ = time_round(make, RunPlan(warmup=warmup, count=batches))
    return figs["samples_per_s"], figs["cpu_s"] / figs["samples"] * 1e3
