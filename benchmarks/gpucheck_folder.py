"""``gpu_check.py``'s ``folder_gpu``: an image folder read in place, feedfast's GPU-placed loader against a
hand-written DALI ``fn.readers.file`` pipeline of the same graph (issue 38's "On a GPU" line).

The ``dataset`` section's photos (the same JPEGs as its shards) are written once as a torchvision ``ImageFolder``
tree, ``<the shards' folder>-folder/train/class<label:04d>/<key>.jpg`` (in feedfast's cache, reused while its
``COMPLETE`` marker is there). Then two loaders over that folder, at the decode batch (256 on a GPU):

- (a) the anchor for folders, written as a DALI user writes it: ``fn.readers.file(file_root=...,
  shuffle_after_epoch=True, name="Reader")`` (DALI's global shuffle, as feedfast's permutation is one) ->
  ``decoders.image_random_crop`` on ``mixed`` -> ``resize`` -> ``crop_mirror_normalize`` (mirror from
  ``coin_flip``, imagenet-train's mean and std) -> ``DALIGenericIterator`` (PARTIAL last batch);
- (b) feedfast's default GPU-placed call, ``feedfast.DataLoader("imagenet-train", shards=<folder>,
  batch_size=256, device="cuda")``, which must run DALI GPU-placed.

Each is created and its first batch taken (seconds from creation, reported, no target), one after the other so
that neither start competes with the other. The rates are then measured in alternating rounds
(:func:`feedfast.baseline.rounds.round_order`: a b, b a, a b): in each, a loader drops ``Sizes.warmup`` batches (the
queue it filled while the other ran), the device is synchronized, ``window`` batches are timed across epoch
boundaries, and the device is synchronized again. The figure judged is the median of the rounds' (b)/(a) ratios,
target at least :data:`FOLDER_SHARE`; on a GPU a miss fails the section, in a dry run (both loaders CPU-placed at
the dry run's sizes, the hand-written one with ``device_id=None`` and its decoder on ``cpu``) it is reported only.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpucheck_common import Context, Section, Target, enforce, judge, say
from gpucheck_default import default_loader, ran_as_default
from gpucheck_sections import forever, need_shards, synchronizer

FOLDER_SHARE = 0.9
"""feedfast's GPU-placed loader over a folder must deliver at least this share of the hand-written reader's rate."""
ROUNDS = 3
"""Alternating rounds (a b, b a, a b): the median of their ratios is judged."""
READER = "Reader"


# ---------------------------------------------------------------------------- the folder
def folder_of(shard_paths: list[str]) -> Path:
    """The shards' photos as an ``ImageFolder`` tree (``train/class<label:04d>/<key>.jpg``), written once beside them.

    Zero-padded class names sort as the labels do, so both readers' labels are the shards' own.
    """
    first = Path(shard_paths[0]).parent
    out = first.with_name(first.name + "-folder")
    if (out / "COMPLETE").exists():
        return out / "train"
    partial = out.with_name(out.name + f".part-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    count = 0
    for shard in shard_paths:
        with tarfile.open(shard) as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            for name, member in members.items():
                if not name.endswith(".jpg"):
                    continue
                key = name[: -len(".jpg")]
                label = _read(tar, members[key + ".cls"]).decode().strip()
                target = partial / "train" / f"class{int(label):04d}" / f"{Path(key).name}.jpg"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(_read(tar, member))
                count += 1
    if not count:
        raise RuntimeError(f"no .jpg members in {len(shard_paths)} shards ({shard_paths[0]} ...)")
    (partial / "COMPLETE").write_text(f"{count}\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out / "train"


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    if handle is None:
        raise RuntimeError(f"{member.name}: not a regular file")
    return handle.read()


# ---------------------------------------------------------------------------- (a) the hand-written reader
class FolderDaliLoader:
    """``fn.readers.file`` -> ``image_random_crop`` -> ``resize`` -> ``crop_mirror_normalize`` in a
    ``DALIGenericIterator``: one epoch per iteration, epoch after epoch; ``device_id=None`` runs it on the CPU."""

    def __init__(self, root: Path, *, size: int, batch_size: int, threads: int, device_id: int | None,
                 seed: int = 0) -> None:
        from nvidia.dali import fn, pipeline_def
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        from feedfast.baseline.dali_recipe import recipe_images
        from feedfast.baseline.torch_recipe import TorchRecipe

        recipe = TorchRecipe(train=True, size=size)

        @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device_id, seed=seed)
        def folder_pipeline() -> Any:
            encoded, labels = fn.readers.file(file_root=str(root), shuffle_after_epoch=True, pad_last_batch=True,
                                              name=READER)
            return recipe_images(encoded, recipe, gpu=device_id is not None), labels

        pipe = folder_pipeline()
        pipe.build()
        self._iterator = DALIGenericIterator([pipe], ["images", "labels"], reader_name=READER,
                                             last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for outputs in self._iterator:
            batch = outputs[0]
            yield batch["images"], batch["labels"].reshape(-1)

    def close(self) -> None:
        """Drop the pipeline (its device memory goes with it)."""
        self._iterator = None  # type: ignore[assignment]


# ---------------------------------------------------------------------------- measuring
def first_batch(batches: Iterator[Any], started: float) -> tuple[Any, float]:
    """The first batch and the seconds from ``started`` (the loader's creation) to it."""
    batch = next(batches)
    return batch, time.perf_counter() - started


def timed_window(batches: Iterator[Any], ctx: Context, warmup: int, window: int) -> float:
    """Images/s over ``window`` batches after dropping ``warmup`` (the queue filled while the other loader ran); the
    device synchronized at both ends."""
    sync = synchronizer(ctx.cuda)
    for _ in range(warmup):
        next(batches)
    sync()
    started, images = time.perf_counter(), 0
    for _ in range(window):
        images += int(next(batches)[0].shape[0])
        ctx.budget.check()
    sync()
    return images / (time.perf_counter() - started)


def folder_gpu_section(ctx: Context, sec: Section) -> None:
    """feedfast's GPU-placed loader over an image folder against a hand-written DALI ``readers.file`` pipeline."""
    from feedfast.baseline.rounds import ratio_spread, round_order
    from feedfast.sources.shardlist import resolve_shards

    shard_paths = ctx.shard_paths or resolve_shards(need_shards(ctx))
    made = time.perf_counter()
    root = folder_of(shard_paths)
    files = sum(1 for _ in root.glob("*/*.jpg"))
    sec.add("folder", files, "JPEGs", f"the dataset's photos as {root}/<class>/<key>.jpg, "
                                      f"ready in {time.perf_counter() - made:.1f} s (written once)")
    batch, size = ctx.sizes.decode_batch, ctx.sizes.image or 224
    window = max(2, ctx.sizes.decode_batches // 4)
    warmup = ctx.sizes.warmup
    loaders: dict[str, Any] = {}
    streams: dict[str, Iterator[Any]] = {}
    firsts: dict[str, tuple[Any, float]] = {}
    try:
        started = time.perf_counter()
        loaders["dali"] = FolderDaliLoader(root, size=size, batch_size=batch, threads=ctx.threads,
                                           device_id=0 if ctx.cuda else None)
        streams["dali"] = forever(loaders["dali"])
        firsts["dali"] = first_batch(streams["dali"], started)
        started = time.perf_counter()
        loaders["feedfast"] = default_loader(ctx, batch, shards=str(root))  # (b) the default call over the folder
        streams["feedfast"] = forever(loaders["feedfast"])
        firsts["feedfast"] = first_batch(streams["feedfast"], started)
        rates: dict[str, list[float]] = {"dali": [], "feedfast": []}
        for k, order in enumerate(round_order(["dali", "feedfast"], ROUNDS)):
            for name in order:
                rates[name].append(timed_window(streams[name], ctx, warmup, window))
                say(f"folder_gpu round {k}: {name} {rates[name][-1]:,.0f} images/s")
    finally:
        for stream in streams.values():
            stream.close()
        for loader in loaders.values():
            loader.close()
    ours = loaders["feedfast"]
    ran_as_default(ctx, ours, "feedfast over the folder")
    spread = ratio_spread(rates["feedfast"], rates["dali"])
    measured = f"median of {ROUNDS} alternating rounds of {window} batches after {warmup} dropped"
    for name, what in (("dali", f"(a) hand-written DALI readers.file ({'mixed' if ctx.cuda else 'cpu'} decode), "
                                f"batch {batch}"),
                       ("feedfast", f"(b) feedfast over the folder, {ours.backend} {ours.plan.placement}-placed, "
                                    f"batch {batch}")):
        images, labels = firsts[name][0]
        sec.add_feed(what, samples_per_s=statistics.median(rates[name]), stall=None, gpu_util=None,
                     first_batch_s=firsts[name][1],
                     note=f"{measured}: {', '.join(f'{r:,.0f}' for r in rates[name])}; {tuple(images.shape[1:])} "
                          f"{images.dtype} on {images.device}, labels {labels.dtype}; no model"
                          + ("; the anchor for folders" if name == "dali" else ""))
    judge(sec, "(b) / (a): folder rate / hand-written readers.file's", spread.median, "x",
          Target(">=", FOLDER_SHARE, "issue 38"), spread.text())
    sec.data.update(folder=str(root), files=files, batch=batch, window=window, rounds=ROUNDS,
                    dali_images_per_s=statistics.median(rates["dali"]), dali_rates=rates["dali"],
                    dali_first_batch_s=firsts["dali"][1],
                    images_per_s=statistics.median(rates["feedfast"]), rates=rates["feedfast"],
                    first_batch_s=firsts["feedfast"][1], share=spread.median, spread=spread.to_dict(),
                    backend=ours.backend, placement=ours.plan.placement)
    enforce(ctx, sec)
