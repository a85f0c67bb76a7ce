"""The contenders of ``make bench``: each a factory of an endless iterator of batches.

All read the same shards with the same number of CPU workers or threads and do the same
work per sample (imagenet-train: random resized crop to 224, horizontal flip, normalize
to CHW float32, int64 labels), except the decode-only ceiling.
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "pipelines" / "imagenet-train.yaml"
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def _forever(make: Callable[[], Any]) -> Iterator[Any]:
    loader = make()
    while True:
        yield from loader


def feedfast_dali(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """feedfast.DataLoader on imagenet-train, DALI CPU."""
    import feedfast

    loader = feedfast.DataLoader(SPEC, shards=shards, batch_size=batch, num_workers=workers, placement="cpu",
                                 backend="dali")
    return _forever(lambda: loader)


def feedfast_pil(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """feedfast.DataLoader on imagenet-train, the portable PIL backend."""
    import feedfast

    loader = feedfast.DataLoader(SPEC, shards=shards, batch_size=batch, num_workers=workers, backend="pil")
    return _forever(lambda: loader)


def feedfast_threads(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """feedfast's threaded CPU path on imagenet-train: ``DataLoader(backend="threads")`` where the
    loader offers it, else :func:`~feedfast.loader.thread_epoch.run_thread_epoch` epoch after epoch."""
    import feedfast

    try:
        loader = feedfast.DataLoader(SPEC, shards=shards, batch_size=batch, num_workers=workers, backend="threads")
    except feedfast.UserError:
        return _thread_epochs(shards, batch, workers)
    return _forever(lambda: loader)


def _thread_epochs(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    from feedfast import _env
    from feedfast.compile.plan import build_plan
    from feedfast.loader.thread_epoch import run_thread_epoch
    from feedfast.sources.assign import plan_epoch
    from feedfast.sources.dataset import open_shards
    from feedfast.spec import load_spec

    spec = load_spec(SPEC).replace(batch_size=batch)
    shard_set = open_shards(shards, spec, _env.cache_dir())
    plan = build_plan(spec, device="cpu")
    epoch = 0
    while True:
        ep = plan_epoch(list(shard_set.sizes), batch_size=batch, rank=0, world=1, last_batch=spec.last_batch,
                        seed=spec.seed, epoch=epoch, shuffle_shards=spec.shuffle_shards)
        for b in run_thread_epoch(plan, shard_set, ep, rank=0, world=1, batch_size=batch, workers=workers,
                                  seed=spec.seed, epoch=epoch):
            yield b.fields["image"], b.fields["label"]
        epoch += 1


def torch_recipe(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """The torchvision DataLoader recipe: webdataset, PIL decode, RandomResizedCrop, flip, ToTensor, Normalize."""
    from feedfast.baseline.torch_recipe import make_torch_loader

    return _forever(lambda: make_torch_loader(shards, batch_size=batch, num_workers=workers))


def hand_dali(shards: list[str], batch: int, workers: int) -> Iterator[Any]:
    """The same pipeline written directly in DALI, as its docs teach (ROI decode, resize, cmn)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import feed_ndarray

    from feedfast.sources.index import default_index_path

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


ROWS: dict[str, tuple[Callable[..., Iterator[Any]], str]] = {
    "feedfast threaded CPU": (feedfast_threads, "feedfast's threaded CPU path (pillow-simd in threads)"),
    "feedfast DALI CPU": (feedfast_dali, "feedfast.DataLoader(imagenet-train.yaml), DALI on the CPU"),
    "hand-written DALI": (hand_dali, "the same graph written directly in DALI"),
    "torchvision recipe": (torch_recipe, "webdataset + PIL + RandomResizedCrop/flip/ToTensor/Normalize, torch DataLoader"),
    "feedfast PIL backend": (feedfast_pil, "feedfast.DataLoader(..., backend='pil')"),
    "PIL decode only (1 core)": (pil_decode_only, "full PIL decode per image, one process: the per-core ceiling"),
}


def time_row(it: Iterator[Any], *, warmup: int, batches: int) -> float:
    """Samples per second over ``batches`` batches after ``warmup``."""
    return time_row_cpu(it, warmup=warmup, batches=batches)[0]


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its live children (DataLoader workers)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue  # a child that ended in the window: its time is lost, and it is small
    return total


def time_row_cpu(it: Iterator[Any], *, warmup: int, batches: int) -> tuple[float, float]:
    """Samples per second, and CPU milliseconds spent per sample (all threads and worker processes).

    On a machine shared with other work, wall-clock rates swing with the others' load; the
    CPU cost per sample does much less, and ``cores / cost`` is the rate a quiet machine
    would reach if the row keeps its cores busy.
    """
    for _ in range(warmup):
        next(it)
    c0, t0, n = cpu_seconds(), time.perf_counter(), 0
    for _ in range(batches):
        n += int(next(it)[0].shape[0])
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return n / wall, cpu / n * 1e3
