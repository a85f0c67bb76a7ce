"""Two ranks on gloo under torchrun, one with a slower dataset, for tests/test_cli_watch.py.

Every step ends in an all_reduce, as DDP's backward does, so the fast rank waits for the slow
one there; only the slow rank waits long for its data. Run unchanged under ``feedfast watch``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Slow(Dataset):
    def __init__(self, n: int, fetch_s: float) -> None:
        self.n, self.fetch_s = n, fetch_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.fetch_s)
        return torch.full((4,), float(index))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=45)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--fetch-ms", type=float, default=1.0)
    p.add_argument("--slow-fetch-ms", type=float, default=5.0)
    p.add_argument("--compute-ms", type=float, default=8.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    fetch_ms = args.slow_fetch_ms if rank == args.slow_rank else args.fetch_ms
    dataset = Slow(args.steps * args.batch * world, fetch_ms / 1e3)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=DistributedSampler(dataset, shuffle=False))
    total = torch.zeros(4)
    for batch in loader:
        time.sleep(args.compute_ms / 1e3)
        step = batch.sum(0)
        dist.all_reduce(step)  # every rank waits for the slowest here, as under DDP
        total += step
    print(f"rank {rank} of {world} (pid {os.getpid()}): done, {float(total.sum()):.0f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
