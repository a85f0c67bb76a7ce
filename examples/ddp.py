"""Data-parallel training with feedfast under torchrun: every rank reads its own share of each epoch.

    torchrun --nproc_per_node=2 examples/ddp.py --steps 5 --batch-size 8 --image-size 64

feedfast.DataLoader takes rank and world size from torch.distributed, splits every epoch so
each sample is read by exactly one rank, and gives every rank the same number of batches, so
no rank waits for another at the end of an epoch. NCCL on CUDA, gloo on the CPU.
With ``last_batch: partial`` (the shipped specs' policy) a rank with one sample fewer fills its
last batch with a repeat of its last sample; ``loader.last_valid`` says how many are real.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

try:
    import feedfast
except ImportError:  # a source checkout that is not pip-installed: use the repository's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import feedfast

from train_resnet import REPO, demo_shards, make_model  # the sibling example


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", help="shard paths, glob or brace pattern (default: a small generated demo set)")
    p.add_argument("--spec", default=str(REPO / "pipelines" / "imagenet-train.yaml"))
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--workers", type=int, default=None, help="loader threads per rank")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = p.parse_args(argv)

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # set by torchrun
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = rank_device(args.device, local_rank, local_world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        if args.shards:
            shards: str | list[str] = args.shards
        else:
            if rank == 0:
                demo_shards()  # one rank writes the demo set, the others wait for it
            dist.barrier()
            shards = demo_shards()
        train(args, shards, device, rank, world)
    finally:
        dist.destroy_process_group()


def rank_device(choice: str, local_rank: int, local_world: int) -> torch.device:
    """This rank's device: its own GPU, ``cuda:LOCAL_RANK``, or the CPU.

    NCCL needs one GPU per rank. With more ranks on this node than GPUs, ``auto`` runs every
    rank on the CPU (gloo), saying so, and ``cuda`` stops with what to run instead: rank 1 of
    two on a one-GPU machine has no ``cuda:1`` to set.
    """
    count = torch.cuda.device_count() if choice != "cpu" and torch.cuda.is_available() else 0
    if choice == "cpu" or (choice == "auto" and count == 0):
        return torch.device("cpu")
    if max(local_rank + 1, local_world) <= count:
        return torch.device("cuda", local_rank)
    fix = f"run torchrun --nproc_per_node={count} (one rank per GPU), or pass --device cpu" if count else \
        "pass --device cpu"
    if choice == "cuda":
        raise SystemExit(f"rank {local_rank} of {local_world} on this node has no GPU of its own: torch sees {count} "
                         f"CUDA device(s) and NCCL needs one per rank; {fix}")
    if local_rank == 0:
        print(f"{local_world} ranks on this node and {count} GPU(s): every rank runs on the CPU (gloo); {fix} "
              "to choose", flush=True)
    return torch.device("cpu")


def train(args: argparse.Namespace, shards: str | list[str], device: torch.device, rank: int, world: int) -> None:
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(make_model(args.num_classes).to(device),
                                    device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    overrides = [f"pipeline.image[1].size={args.image_size}"] if args.image_size else []
    loader = feedfast.DataLoader(args.spec, shards=shards, batch_size=args.batch_size, shuffle=True,
                                 num_workers=args.workers, device=device, overrides=overrides)
    print(f"rank {rank}/{world}: {len(loader)} batches per epoch", flush=True)
    counts = _gather(len(loader), device, world)
    if rank == 0:
        print(f"batches per epoch on every rank: {counts}", flush=True)
    if len(set(counts)) != 1:
        raise RuntimeError(f"ranks disagree on the number of batches per epoch: {counts}")

    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        model.train()
        steps = 0
        for images, target in loader:
            loss = criterion(model(images), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces gradients here: every rank must take the same steps
            optimizer.step()
            steps += 1
            if rank == 0:
                print(f"epoch {epoch} step {steps}/{len(loader)} loss {loss.item():.4f}", flush=True)
            if steps == args.steps:
                break
        print(f"rank {rank}/{world}: epoch {epoch} ran {steps} steps, {loader.stats()['delivered']} samples "
              "delivered so far", flush=True)
    loader.close()


def _gather(value: int, device: torch.device, world: int) -> list[int]:
    """``value`` from every rank, in rank order."""
    out = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(out, torch.tensor([value], dtype=torch.int64, device=device))
    return [int(t.item()) for t in out]


if __name__ == "__main__":
    main()
