"""A plain torch loop over a slow map-style dataset, for tests/test_cli_watch.py (run unchanged under watch).

Each sample costs ``--fetch-ms`` (a sleep: a decode), each step ``--compute-ms`` (a sleep: a GPU
step frees the core). The loop times its own waits (inside ``next()``) and steps and writes to
``--truth`` the stall over the steps the meter counts: from the third batch on (the meter takes
the first unmeasured, then leaves 10 steps out as its warm-up).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

LEFT_OUT = 11  # the first batch, then the meter's 10 warm-up steps


class Slow(Dataset):
    def __init__(self, n: int, fetch_s: float) -> None:
        self.n, self.fetch_s = n, fetch_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.fetch_s)
        return torch.full((3, 8, 8), float(index)), index % 10


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--fetch-ms", type=float, default=2.0)
    p.add_argument("--compute-ms", type=float, default=12.0)
    p.add_argument("--truth", default=None)
    p.add_argument("--exit", type=int, default=0, help="exit with this status after the loop")
    p.add_argument("--device", default="cpu", help="where each batch goes (cuda: CUDA events in the meter)")
    args = p.parse_args()
    loader = DataLoader(Slow(args.steps * args.batch, args.fetch_ms / 1e3), batch_size=args.batch,
                        num_workers=args.workers)
    waits, steps = [], []
    it = iter(loader)
    while True:
        start = time.perf_counter()
        try:
            images, labels = next(it)
        except StopIteration:
            break
        got = time.perf_counter()
        images.to(args.device).mul(2).sum()  # on cuda, the work the meter's events are ordered after
        time.sleep(args.compute_ms / 1e3)
        waits.append(got - start)
        steps.append(time.perf_counter() - start)
    counted = slice(LEFT_OUT, None)
    truth = sum(waits[counted]) / sum(steps[counted])
    if args.truth:
        with open(args.truth, "w") as f:
            json.dump({"stall_fraction": truth, "steps": len(steps[counted])}, f)
    print(f"job: {len(steps)} steps, stall {truth:.3f}")
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
