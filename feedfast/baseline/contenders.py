"""The loaders a comparison times, each as one small :class:`Contender`: feedfast's and a baseline.

A baseline is built from a feedfast loader so that both read the same thing: the same shard
files through the same (possibly filtered) index files, hence the same samples; the same
batch size; as many worker processes (torch) or threads (DALI) as feedfast's threads; the
spec's crop, flip, statistics, shuffling and seed (:mod:`feedfast.baseline.from_spec`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from feedfast.baseline.from_spec import BaselineSettings, settings_from_spec
from feedfast.errors import UserError

BASELINES = ("torch", "dali")
"""The baselines ``feedfast bench --compare`` knows."""


@dataclass
class Contender:
    """One loader in a comparison.

    Attributes:
        name: ``feedfast``, ``torch`` or ``dali``.
        batches: its batches, epoch after epoch, for as long as they are asked for.
        started: ``time.perf_counter()`` when it was built.
        close: releases its threads, processes and memory.
        delivered: its running count of delivered samples, when its batches may hold padding.
        recipe: what it runs, in words.
        ahead: at most how many batches it holds ready when asked again after a pause.
    """

    name: str
    batches: Iterator[Any]
    started: float
    close: Callable[[], None]
    delivered: Callable[[], int] | None = None
    recipe: str = ""
    ahead: int = 0

    def first_batch(self) -> float:
        """Take one batch; return the seconds from construction to it (time to first batch)."""
        next(self.batches)
        return time.perf_counter() - self.started


def make_baseline(name: str, loader: Any) -> Contender:
    """The ``torch`` or ``dali`` baseline for a feedfast ``loader``.

    Raises:
        UserError: an unknown name, shards that are not local files, a spec the baselines
            cannot follow, or torchvision (torch) or DALI (dali) missing.
    """
    if name not in BASELINES:
        raise UserError(f"unknown baseline {name!r}; choose one of {', '.join(BASELINES)}")
    kinds = sorted(set(loader.shards.read_kinds) - {"file"})
    if kinds:
        raise UserError(f"--compare reads local tar files; these shards are read as {', '.join(kinds)}: "
                        "copy them to local disk first")
    settings = settings_from_spec(loader.spec)
    started = time.perf_counter()
    build = _torch if name == "torch" else _dali
    return build(loader, settings, started)


def _forever(loader: Any) -> Generator[Any, None, None]:
    while True:
        yield from loader


def _torch(loader: Any, settings: BaselineSettings, started: float) -> Contender:
    from feedfast.baseline.torch_recipe import make_torch_loader

    r = settings.recipe
    torch_loader = make_torch_loader(
        list(loader.shards.paths), index_paths=list(loader.shards.index_paths), batch_size=loader.spec.batch_size,
        num_workers=loader.threads, train=r.train, size=r.size, resize=r.resize, scale=r.scale, ratio=r.ratio,
        flip_p=r.flip_p, mean=r.mean, std=r.std, seed=settings.seed, shuffle=settings.shuffle,
        image_ext=settings.image_ext, label_ext=settings.label_ext)
    batches = _forever(torch_loader)
    import torchvision  # imported by make_torch_loader, through feedfast.baseline.vision

    def close() -> None:
        batches.close()
        iterator = getattr(torch_loader, "_iterator", None)  # torch has no public way to stop persistent workers
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        torch_loader.dataset.close()  # type: ignore[attr-defined]  # a ShardSamples

    recipe = (f"torchvision {torchvision.__version__} transforms: {', '.join(r.describe())}; {_pil()} decode from a "
              f"map-style dataset over the shards' indexes; torch DataLoader, {loader.threads} persistent workers")
    ahead = loader.threads * (torch_loader.prefetch_factor or 0)  # each worker's queued batches
    return Contender("torch", batches, started, close, recipe=recipe, ahead=ahead)


def _pil() -> str:
    """The PIL the baseline runs on: pillow-simd is faster than the stock Pillow most users have."""
    from importlib import metadata

    for dist in ("pillow-simd", "pillow"):
        try:
            return f"{metadata.metadata(dist)['Name']} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "PIL"


def _dali(loader: Any, settings: BaselineSettings, started: float) -> Contender:
    from feedfast.baseline.dali_recipe import DaliRecipeLoader

    r = settings.recipe
    device_id = loader.device_id if loader.plan.placement == "gpu" else None
    dali_loader = DaliRecipeLoader(
        list(loader.shards.paths), list(loader.shards.index_paths), recipe=r, batch_size=loader.spec.batch_size,
        threads=loader.threads, device_id=device_id, seed=settings.seed, shuffle=settings.shuffle,
        image_ext=settings.image_ext, label_ext=settings.label_ext)
    batches = _forever(dali_loader)
    ops = ("decoders.image_random_crop, resize" if r.train else "decoders.image, resize(resize_shorter)")
    where = "mixed decode, GPU ops" if device_id is not None else "CPU"
    recipe = (f"hand-written DALI ({where}, {loader.threads} threads): readers.webdataset with feedfast's indexes, "
              f"{ops}, crop_mirror_normalize; DALIGenericIterator (PARTIAL last batch)")
    return Contender("dali", batches, started, batches.close, recipe=recipe, ahead=2)  # DALI's prefetch_queue_depth
