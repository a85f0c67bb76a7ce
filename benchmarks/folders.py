"""Images in place against the same images as shards, and against torchvision's ImageFolder recipe.

One process, alternating rounds (:func:`feedfast.baseline.rounds.round_order`): each round runs one
epoch of each contender over the same natural photographs (``benchmarks/photos.py``'s ``imagenet``
set), shuffled, batch 64, RandomResizedCrop 224, horizontal flip, normalize:

- ``folder``: ``feedfast.DataLoader(imagenet-train, shards=<folder>)``, the threaded backend;
- ``shards``: the same loader over the shards the photos came from;
- ``torchvision``: ``ImageFolder`` + ``torch.utils.data.DataLoader`` (2 workers, the real
  torchvision transforms), over the folder.

The folder is the shards' photos written out once as ``<cache>/photos-folder-<set>/<label>/<key>.jpg``.
Prints each round's images/s, the medians and the ratios (targets: folder >= 0.9 x shards,
folder >= 2.5 x torchvision).

    python benchmarks/folders.py --rounds 3 [--samples 2048] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

from feedfast import _env  # noqa: E402
from feedfast.baseline.rounds import round_order  # noqa: E402

SPEC = ROOT.parent / "pipelines" / "imagenet-train.yaml"
BATCH = 64


def folder_of(shards: list[str]) -> Path:
    """The shards' photos as an image folder (``<label>/<key>.jpg``), written once beside the shards."""
    out = Path(shards[0]).parent.with_name(Path(shards[0]).parent.name + "-folder")
    if (out / "COMPLETE").exists():
        return out / "train"
    for shard in shards:
        with tarfile.open(shard) as tar:
            members = {m.name: m for m in tar.getmembers()}
            for name, member in members.items():
                if not name.endswith(".jpg"):
                    continue
                key = name[: -len(".jpg")]
                label = tar.extractfile(members[key + ".cls"]).read().decode()  # type: ignore[union-attr]
                target = out / "train" / f"class{int(label):02d}" / f"{key}.jpg"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    (out / "COMPLETE").write_text("ok\n")
    return out / "train"


def timed(batches: Iterable[Any], size: Callable[[Any], int]) -> float:
    """Images per second over one pass of ``batches`` (the first batch's wait included)."""
    start, n = time.perf_counter(), 0
    for batch in batches:
        n += size(batch)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None, help="feedfast's threads (default: the usable cores)")
    parser.add_argument("--workers", type=int, default=2, help="torchvision DataLoader workers")
    args = parser.parse_args()

    import torch
    import torchvision.transforms as T
    from photos import photo_dataset
    from torchvision.datasets import ImageFolder

    import feedfast

    shards = photo_dataset("imagenet", samples=args.samples, per_shard=256)
    folder = folder_of(shards)
    common = {"batch_size": BATCH, "shuffle": True, "device": "cpu", "backend": "threads", "num_workers": args.threads}
    loaders = {"folder": feedfast.DataLoader(str(SPEC), shards=str(folder), **common),
               "shards": feedfast.DataLoader(str(SPEC), shards=shards, **common)}
    recipe = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    torch_loader = torch.utils.data.DataLoader(ImageFolder(str(folder), transform=recipe), batch_size=BATCH,
                                               shuffle=True, num_workers=args.workers)
    for loader in loaders.values():  # a warm-up epoch each: listing, indexes, page cache
        timed(loader, lambda b: len(b[1]))
        loader.close()
    timed(torch_loader, lambda b: len(b[1]))
    print(f"{args.samples} photos, batch {BATCH}, feedfast threads {loaders['folder'].threads}, "
          f"torchvision workers {args.workers}, cores {_env.usable_cores()}", flush=True)
    rates: dict[str, list[float]] = {"folder": [], "shards": [], "torchvision": []}
    for k, order in enumerate(round_order(list(rates), args.rounds)):
        for name in order:
            rate = timed(torch_loader if name == "torchvision" else loaders[name], lambda b: len(b[1]))
            if name != "torchvision":
                loaders[name].close()  # its next epoch, started ahead, would run during the others' rounds
            rates[name].append(rate)
            print(f"round {k}: {name:12s} {rate:8.1f} images/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        print(f"median {name:12s} {value:8.1f} images/s")
    print(f"folder / shards      {medians['folder'] / medians['shards']:.2f}  (target >= 0.9)")
    print(f"folder / torchvision {medians['folder'] / medians['torchvision']:.2f}  (target >= 2.5)")
    for loader in loaders.values():
        loader.close()


if __name__ == "__main__":
    main()
