"""The loaders a comparison times, each as one small :class:`Contender`: feedfast's and a baseline.

A baseline is built from a feedfast loader so that both read the same thing: the same shard
files through the same (possibly filtered) index files, hence the same samples; the same
batch size; as many worker processes (torch) or threads (DALI) as feedfast's threads; the
spec's crop, flip, statistics, shuffling and seed (:mod:`feedfast.baseline.from_spec`).

A comparison builds a new contender for each round and closes it at the round's end
(:func:`feedfast.baseline.timing.time_round`): a Contender is iterated like the loader it
wraps, epoch after epoch, and has the ``delivered()`` and ``close()`` that the round uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from feedfast.baseline.from_spec import BaselineSettings, settings_from_spec
from feedfast.baseline.measure import forever
from feedfast.errors import UserError

BASELINES = ("torch", "dali")
"""The baselines ``feedfast bench --compare`` knows."""


@dataclass
class Contender:
    """One loader in a comparison, for one round.

    Attributes:
        name: ``feedfast``, ``torch`` or ``dali``.
        batches: its batches, epoch after epoch, for as long as they are asked for.
        close: releases its threads, processes and memory.
        delivered: its running count of delivered samples, when its batches may hold padding.
        recipe: what it runs, in words.
    """

    name: str
    batches: Iterator[Any]
    close: Callable[[], None]
    delivered: Callable[[], int] | None = None
    recipe: str = ""

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return next(self.batches)


def feedfast_contender(loader: Any, *, closed: Callable[[Any], None] | None = None) -> Contender:
    """A feedfast ``DataLoader`` as a contender: its batches epoch after epoch, its delivered count.

    Closing it stops the loader's background work (a threads-backend loader starts its next
    epoch ahead), then calls ``closed(loader)``, e.g. to read its final ``stats()``.
    """
    batches = forever(loader)

    def close() -> None:
        batches.close()
        loader.close()
        if closed is not None:
            closed(loader)

    return Contender("feedfast", batches, close, delivered=lambda: int(loader.stats()["delivered"]))


def check_baseline(name: str, loader: Any) -> BaselineSettings:
    """The settings of the ``torch`` or ``dali`` baseline for a feedfast ``loader``, once it can be built.

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
    if name == "torch":
        from feedfast.baseline.vision import transforms

        transforms()
    else:
        from feedfast.baseline.dali_recipe import dali_iterator

        dali_iterator()
    return settings


def make_baseline(name: str, loader: Any) -> Contender:
    """The ``torch`` or ``dali`` baseline for a feedfast ``loader``, newly built.

    Raises:
        UserError: as :func:`check_baseline`.
    """
    settings = check_baseline(name, loader)
    build = _torch if name == "torch" else _dali
    return build(loader, settings)


def _torch(loader: Any, settings: BaselineSettings) -> Contender:
    from feedfast.baseline.torch_recipe import MixupCutmixCollate, make_torch_loader

    r, m = settings.recipe, settings.mix
    mix = MixupCutmixCollate(m.mixup_alpha, m.cutmix, num_classes=m.num_classes) if m is not None else None
    torch_loader = make_torch_loader(
        list(loader.shards.paths), index_paths=list(loader.shards.index_paths), batch_size=loader.spec.batch_size,
        num_workers=loader.threads, train=r.train, size=r.size, resize=r.resize, scale=r.scale, ratio=r.ratio,
        flip_p=r.flip_p, mean=r.mean, std=r.std, seed=settings.seed, shuffle=settings.shuffle,
        image_ext=settings.image_ext, label_ext=settings.label_ext, trivial_augment=r.trivial_augment,
        random_erasing=r.random_erasing, mixup_cutmix=mix)
    batches = forever(torch_loader)
    import torchvision  # imported by make_torch_loader, through feedfast.baseline.vision

    def close() -> None:
        batches.close()
        iterator = getattr(torch_loader, "_iterator", None)  # torch has no public way to stop persistent workers
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        torch_loader.dataset.close()  # type: ignore[attr-defined]  # a ShardSamples

    recipe = (f"torchvision {torchvision.__version__} transforms: {', '.join(r.describe())}; {_pil()} decode from a "
              f"map-style dataset over the shards' indexes; torch DataLoader, {loader.threads} persistent workers"
              + (f"; collate_fn RandomChoice([MixUp({m.mixup_alpha:g}), CutMix({m.cutmix:g})]) as torchvision's "
                 "reference" if m is not None else "") + _left_out(settings.left_out))
    return Contender("torch", batches, close, recipe=recipe)


def _left_out(ops: tuple[str, ...]) -> str:
    """The spec's ops a baseline does not run, said in its description (its ratio is then not like for like)."""
    return f"; NOT in this baseline (the ratio is not like for like): {', '.join(ops)}" if ops else ""


def _runs(recipe: Any, op: str) -> bool:
    """Whether the spec's recipe has ``op`` (the hand-written DALI baseline runs neither of these)."""
    return recipe.trivial_augment if op == "trivial_augment_wide" else recipe.random_erasing > 0


def _pil() -> str:
    """The PIL the baseline runs on: pillow-simd is faster than the stock Pillow most users have."""
    from importlib import metadata

    for dist in ("pillow-simd", "pillow"):
        try:
            return f"{metadata.metadata(dist)['Name']} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "PIL"


def _dali(loader: Any, settings: BaselineSettings) -> Contender:
    from feedfast.baseline.dali_recipe import DaliRecipeLoader

    r = settings.recipe
    device_id = loader.device_id if loader.plan.placement == "gpu" else None
    dali_loader = DaliRecipeLoader(
        list(loader.shards.paths), list(loader.shards.index_paths), recipe=r, batch_size=loader.spec.batch_size,
        threads=loader.threads, device_id=device_id, seed=settings.seed, shuffle=settings.shuffle,
        image_ext=settings.image_ext, label_ext=settings.label_ext)
    batches = forever(dali_loader)
    ops = ("decoders.image_random_crop, resize" if r.train else "decoders.image, resize(resize_shorter)")
    where = "mixed decode, GPU ops" if device_id is not None else "CPU"
    recipe = (f"hand-written DALI ({where}, {loader.threads} threads): readers.webdataset with feedfast's indexes, "
              f"{ops}, crop_mirror_normalize; DALIGenericIterator (PARTIAL last batch)"
              + _left_out(tuple(o for o in ("trivial_augment_wide", "random_erasing") if _runs(r, o))
                          + (("batch.mix",) if settings.mix is not None else ()) + settings.left_out))
    return Contender("dali", batches, batches.close, recipe=recipe)
