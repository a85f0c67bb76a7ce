"""Two loaders read at once: a torch DataLoader with forked workers zipped with a feedfast DataLoader.

For tests/test_cli_watch.py; run unchanged under ``feedfast watch`` with ``--spec`` (a YAML
file) and ``--shards`` (comma-separated).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

import feedfast


class Slow(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.full((4,), float(index))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--shards", required=True)
    p.add_argument("--epochs", type=int, default=8)
    args = p.parse_args()
    shards = feedfast.DataLoader(args.spec, shards=args.shards.split(","), num_workers=1, device="cpu")
    plain = DataLoader(Slow(4 * len(shards)), batch_size=4, num_workers=2, multiprocessing_context="fork")
    steps = 0
    for _ in range(args.epochs):
        for _tensors, (_images, _labels) in zip(plain, shards):
            time.sleep(0.004)
            steps += 1
    print(f"two loaders: {steps} steps")


if __name__ == "__main__":
    main()
