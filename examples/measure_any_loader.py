"""Measure how long an ordinary torch training loop waits for its DataLoader.

The loop below is a plain PyTorch loop; the only change is ``meter.wrap(loader)``.
It runs on a CPU in a few seconds; on a GPU machine the meter reads CUDA events
instead of host time and says so in its basis.

    python examples/measure_any_loader.py [--plot meter.png] [--json meter.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    import feedfast  # noqa: F401
except ImportError:  # a source checkout that is not pip-installed: use the repository's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from feedfast.errors import UserError
from feedfast.meter import StallMeter


class SlowSyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """Random 3x32x32 images with 10 classes; each sample costs ``decode_ms`` to "decode"."""

    def __init__(self, n: int = 640, decode_ms: float = 0.4) -> None:
        self.n = n
        self.decode_s = decode_ms / 1e3

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.decode_s)  # stands in for JPEG decode and augmentation
        generator = torch.Generator().manual_seed(index)
        return torch.rand(3, 32, 32, generator=generator), index % 10


def tiny_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", help="write a PNG of wait and step time (needs matplotlib)")
    parser.add_argument("--json", help="write the summary as JSON")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = tiny_cnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(SlowSyntheticImages(), batch_size=32, shuffle=True, num_workers=0)

    def log(figures: dict[str, float]) -> None:
        if "window/stall_fraction" not in figures:  # the meter's warm-up steps are not measured
            return
        stall, size = figures["window/stall_fraction"], int(figures["window/size"])
        print(f"step {figures['steps']:4d}: stall {stall:.0%} over the last {size} steps")

    with StallMeter(window=10, every=10, callback=log) as meter:
        for images, labels in meter.wrap(loader):  # the only line that changed
            images, labels = images.to(device), labels.to(device)
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    print(meter.table())
    summary = meter.summary()
    print(
        f"\nThe loader would need {summary['required_samples_per_s']:,.0f} samples/s to keep up "
        f"(it delivered {summary['samples_per_s']:,.0f})."
    )
    if args.json:
        meter.to_json(args.json)
    if args.plot:
        try:
            print(f"plot: {meter.plot(args.plot)}")
        except UserError as exc:
            print(f"no plot: {exc}")


if __name__ == "__main__":
    main()
