"""feedfast's DALI backend against a hand-written DALI pipeline of the same graph, on the CPU: the loader around DALI.

Issue 36's CPU proxy of the GPU path. The images are cheap to decode but of a realistic byte size
(64x64 JPEGs carrying a comment segment that brings each to about 55 KB, as a photo's), so what is
measured is what surrounds DALI's decode: the feed, the epoch boundaries, the producer thread. 32
shards x 256 samples plus a ``.cls``, batch 256, decode + RandomResizedCrop(32) + flip + normalize to
float CHW, shuffled, on 2 DALI threads, 6 epochs a run:

- ``handwritten``: :class:`feedfast.baseline.dali_recipe.DaliRecipeLoader`, ``fn.readers.webdataset``
  (shuffled in its buffer) -> ``decoders.image_random_crop`` -> ``resize`` -> ``crop_mirror_normalize``
  in a ``DALIGenericIterator``, as a DALI user writes it;
- ``feedfast``: ``feedfast.DataLoader(spec, backend="dali", device="cpu", shuffle=True)`` (the global
  permutation through feedfast's feed).

Each is timed from its construction to its last batch (the hand-written loader builds its pipeline and
runs its first batch in its constructor). The two alternate within a round; printed: each one's images/s, the ratio feedfast / hand-written
per round and its median, and how many times DALI's ``Pipeline.build`` ran for feedfast's loader.

Usage::

    python benchmarks/dali_loader.py [--rounds 3] [--epochs 6] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARDS, PER_SHARD, SIDE, BYTES, BATCH = 32, 256, 64, 55_000, 256
SPEC = {"version": 1, "name": "dali-loader",
        "pipeline": {"image": ["decode", {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5}},
                               "normalize"],
                     "label": ["label"]},
        "outputs": ["image", "label"], "batch": {"size": BATCH}, "seed": 0}


def padded_jpeg(seed: int, nbytes: int = BYTES) -> bytes:
    """A 64x64 JPEG with a COM segment after its SOI that brings it to about ``nbytes``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = (rng.random((SIDE, SIDE, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    jpeg = out.getvalue()
    comment = b"\xff\xfe"
    room = max(0, nbytes - len(jpeg) - 4)
    segments = b""
    while room > 0:  # a COM segment holds at most 65,533 bytes
        size = min(room, 65_533)
        segments += comment + (size + 2).to_bytes(2, "big") + rng.bytes(size)
        room -= size + 4
    return jpeg[:2] + segments + jpeg[2:]


def make_set(folder: Path) -> tuple[list[str], list[str]]:
    """The shards and their index files (written once into ``folder``)."""
    from feedfast.shards.index.tarindex import load_index

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(SHARDS):
        path = folder / f"cheap-{s:04d}.tar"
        paths.append(str(path))
        if path.exists():
            continue
        tmp = path.with_suffix(".part")
        with tarfile.open(tmp, "w") as tar:
            for i in range(PER_SHARD):
                n = s * PER_SHARD + i
                for ext, payload in (("jpg", padded_jpeg(n)), ("cls", str(n % 1000).encode())):
                    info = tarfile.TarInfo(f"{n:07d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        os.replace(tmp, path)
    return paths, [str(load_index(p, folder)[0]) for p in paths]


def drain(loader: Any, epochs: int, start: float) -> tuple[float, int]:
    """Seconds from ``start`` (before the loader was made) to the end of ``epochs`` epochs of ``loader``, and the
    images taken: both loaders are timed from their construction, which for the hand-written one builds its
    pipeline and runs its first batch (``DALIGenericIterator`` prepares it), for feedfast's starts its build."""
    images = 0
    for _ in range(epochs):
        for batch in loader:
            images += int(batch[0].shape[0])
    return time.perf_counter() - start, images


def handwritten(paths: list[str], index_paths: list[str], threads: int, epochs: int) -> float:
    from feedfast.baseline.dali_recipe import DaliRecipeLoader
    from feedfast.baseline.torch_recipe import TorchRecipe

    start = time.perf_counter()
    loader = DaliRecipeLoader(paths, index_paths, recipe=TorchRecipe(train=True, size=32), batch_size=BATCH,
                              threads=threads, device_id=None, seed=0, shuffle=True)
    seconds, images = drain(loader, epochs, start)
    del loader
    return images / seconds


def feedfast_loader(paths: list[str], threads: int, epochs: int) -> tuple[float, int]:
    from nvidia.dali import Pipeline

    import feedfast

    builds = []
    real = Pipeline.build

    def counted(self: Any, *args: Any, **kw: Any) -> Any:
        if not getattr(self, "_built", False):
            builds.append(1)
        return real(self, *args, **kw)

    Pipeline.build = counted  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        loader = feedfast.DataLoader(SPEC, shards=paths, backend="dali", device="cpu", shuffle=True,
                                     num_workers=threads)
        seconds, images = drain(loader, epochs, start)
        loader.close()
    finally:
        Pipeline.build = real  # type: ignore[method-assign]
    return images / seconds, len(builds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from feedfast._env import cache_dir

    paths, index_paths = make_set(args.folder or cache_dir() / "bench-dali-loader")
    for path in paths:  # warm page cache
        Path(path).read_bytes()
    rounds = []
    for r in range(args.rounds):
        hand = handwritten(paths, index_paths, args.threads, args.epochs)
        ours, builds = feedfast_loader(paths, args.threads, args.epochs)
        rounds.append({"handwritten": hand, "feedfast": ours, "ratio": ours / hand, "builds": builds})
        print(f"round {r}: hand-written {hand:8,.0f} images/s  feedfast {ours:8,.0f}  ratio {ours / hand:.2f}  "
              f"Pipeline.build x{builds}", flush=True)
    median = {key: statistics.median(r[key] for r in rounds) for key in ("handwritten", "feedfast", "ratio")}
    print(f"median over {args.rounds} rounds of {args.epochs} epochs: hand-written {median['handwritten']:,.0f}, "
          f"feedfast {median['feedfast']:,.0f} images/s, ratio {median['ratio']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"median": median, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
