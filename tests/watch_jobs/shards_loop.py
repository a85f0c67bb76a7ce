"""One training loop over WebDataset shards, read by torch's DataLoader, feedfast's, or both at once (``--loader``).

For tests/test_cli_watch.py (``both``: two loaders read at once, torch's with forked workers)
and docs/stall-meter.md's ``feedfast watch`` example (the same job on either loader). The torch side is
the usual WebDataset recipe (PIL decode, a crop and resize, tensors); the step is simulated
(``--step-ms``, a sleep: a GPU step frees the core).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch


def torch_loader(shards: str, batch: int, workers: int, size: int) -> Any:
    import webdataset as wds
    from torch.utils.data import DataLoader

    def to_tensor(image: Any) -> torch.Tensor:
        side = min(image.size)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        image = image.convert("RGB").crop((left, top, left + side, top + side)).resize((size, size))
        return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)

    dataset = (wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode("pil")
               .to_tuple("jpg", "cls").map_tuple(to_tensor, int))
    return DataLoader(dataset, batch_size=batch, num_workers=workers, multiprocessing_context="fork" if workers else None)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shards", required=True, help="a brace pattern: data/train-{0000..0007}.tar")
    p.add_argument("--loader", choices=("torch", "feedfast", "both"), default="torch")
    p.add_argument("--spec", default="imagenet-train", help="feedfast's pipeline (--loader feedfast)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-ms", type=float, default=20.0)
    args = p.parse_args()
    loaders = []
    if args.loader in ("torch", "both"):
        loaders.append(torch_loader(args.shards, args.batch, args.workers, args.size))
    if args.loader in ("feedfast", "both"):
        import feedfast

        loaders.append(feedfast.DataLoader(args.spec, shards=args.shards, batch_size=args.batch,
                                           num_workers=args.workers, device="cpu"))
    steps, shape, started = 0, (), time.perf_counter()
    while steps < args.steps:
        for batches in zip(*loaders):
            shape = tuple(batches[0][0].shape)
            time.sleep(args.step_ms / 1e3)  # the model's step
            steps += 1
            if steps == args.steps:
                break
    print(f"{args.loader}: {steps} steps of {shape} in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
