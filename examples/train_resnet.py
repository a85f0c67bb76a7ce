"""Train a ResNet on ImageNet-style WebDataset shards: the usual torch loop, one line changed.

The loop is the torchvision reference recipe (SGD with momentum, cross-entropy, a step
learning-rate schedule, ``set_epoch`` every epoch, with ``--checkpoint`` a checkpoint every
epoch that holds the loader's ``state_dict()`` as JSON). Moving it
from ``torch.utils.data.DataLoader`` to ``feedfast.DataLoader`` changes the one line marked
``<- the only change`` below; the torch line is kept in a comment right above it.

Runs on a CPU in seconds with a small demo dataset generated on first use:

    python examples/train_resnet.py --steps 3 --batch-size 8 --image-size 64
    python examples/train_resnet.py --shards 'data/train-{0000..0127}.tar' --epochs 90 --compile

The model is torchvision's ``resnet18`` when torchvision imports, else a small ResNet
defined below, so the example runs without torchvision.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

try:
    import feedfast
except ImportError:  # a source checkout that is not pip-installed: use the repository's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import feedfast

from feedfast.write.demo import synth_dataset

REPO = Path(__file__).resolve().parents[1]
DEMO_SAMPLES, DEMO_PER_SHARD, DEMO_SIDES = 256, 32, (80, 160)


def demo_shards() -> list[str]:
    """A small ImageNet-like demo set (1000 classes) in feedfast's cache, generated once."""
    return synth_dataset(samples=DEMO_SAMPLES, per_shard=DEMO_PER_SHARD, min_side=DEMO_SIDES[0],
                         max_side=DEMO_SIDES[1], num_classes=1000,
                         announce=lambda out: print(f"generating {DEMO_SAMPLES} demo JPEGs in {out} ...", flush=True))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (torchvision's BasicBlock)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class SmallResNet(nn.Module):
    """A ResNet-10-shaped network (one BasicBlock per stage) for machines without torchvision."""

    def __init__(self, num_classes: int = 1000, widths: tuple[int, ...] = (32, 64, 128, 256)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], widths[0]
        for i, w in enumerate(widths):
            stages.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            cin = w
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def make_model(num_classes: int) -> nn.Module:
    """torchvision's resnet18 when torchvision is installed, else :class:`SmallResNet`."""
    try:
        import torchvision
    except ImportError as exc:  # torchvision is optional; one built for another torch fails here, loudly
        print(f"torchvision is not installed ({exc}); using the example's SmallResNet")
        return SmallResNet(num_classes)
    return torchvision.models.resnet18(num_classes=num_classes)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: torch sees no CUDA device here; use --device cpu")
    return torch.device(name)


def train_one_epoch(loader: Any, model: nn.Module, criterion: nn.Module, optimizer: torch.optim.Optimizer,
                    epoch: int, device: torch.device, max_steps: int | None) -> int:
    """One epoch (or ``max_steps`` steps of it); returns the number of steps run."""
    model.train()
    steps = len(loader) if max_steps is None else min(max_steps, len(loader))
    last, step = time.perf_counter(), 0
    for step, (images, target) in enumerate(loader, 1):
        images = images.to(device, non_blocking=True)  # no-ops with feedfast: batches arrive on `device`
        target = target.to(device, non_blocking=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value, now = loss.item(), time.perf_counter()
        print(f"epoch {epoch} step {step}/{steps} loss {value:.4f} ({(now - last) * 1e3:.0f} ms)", flush=True)
        last = now
        if step == max_steps:
            break
    return step


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", help="shard paths, glob or brace pattern (default: a small generated demo set)")
    p.add_argument("--spec", default=str(REPO / "pipelines" / "imagenet-train.yaml"), help="the pipeline spec")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=None, help="loader threads (default: all cores)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--image-size", type=int, default=None, help="crop size (overrides the spec's 224)")
    p.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    p.add_argument("--checkpoint", help="write model, optimizer and loader state here after each epoch")
    p.add_argument("--resume", help="continue from a checkpoint written by --checkpoint")
    args = p.parse_args(argv)

    device = pick_device(args.device)
    torch.manual_seed(0)
    model = make_model(args.num_classes).to(device)
    net = cast(nn.Module, torch.compile(model)) if args.compile else model  # `model` keeps plain state_dict keys
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    shards = args.shards or demo_shards()
    overrides = [f"pipeline.image[1].size={args.image_size}"] if args.image_size else []
    # train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=True)
    train_loader = feedfast.DataLoader(args.spec, shards=shards, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=True, device=device, overrides=overrides)  # <- the only change

    start_epoch = 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location=device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        train_loader.load_state_dict(json.loads(ckpt["loader"]))
        start_epoch = ckpt["epoch"]
        print(f"resumed from {args.resume} at epoch {start_epoch}")

    print(f"{type(model).__name__} on {device}, {len(train_loader)} batches per epoch")
    for epoch in range(start_epoch, start_epoch + args.epochs):
        train_loader.set_epoch(epoch)
        steps = train_one_epoch(train_loader, net, criterion, optimizer, epoch, device, args.steps)
        scheduler.step()
        print(f"epoch {epoch} done: {steps} steps, loader stats {train_loader.stats()}", flush=True)
        if args.checkpoint:
            torch.save({
                "epoch": epoch + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "loader": json.dumps(train_loader.state_dict()),
            }, args.checkpoint)
    train_loader.close()


if __name__ == "__main__":
    main()
