"""PyTorch Lightning with feedfast: ``train_dataloader`` returns a ``feedfast.DataLoader``.

    pip install lightning     # or pytorch-lightning; check that it keeps your torch version
    python examples/train_lightning.py --steps 5 --batch-size 8 --image-size 64

What differs from a torch DataLoader:

* Lightning calls ``set_epoch`` only on a loader's ``sampler``, which feedfast's loader has
  not, so ``on_train_epoch_start`` calls it.
* Lightning must not wrap the loader in a ``DistributedSampler``; feedfast splits each epoch
  over ranks itself (``Trainer(use_distributed_sampler=False)``).
* Nothing to do for checkpoints: Lightning saves the state of any loader with ``state_dict``
  and ``load_state_dict`` in its checkpoint and restores it on ``fit(ckpt_path=...)``
  (seen with Lightning 2.6), mid-epoch included.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent


def _import_lightning() -> Any:
    """``lightning``, else ``pytorch_lightning``, else None."""
    try:
        for name in ("lightning", "pytorch_lightning"):
            try:
                return importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name != name:  # installed, but something it needs is missing: say so
                    raise
        return None
    finally:
        sys.path.insert(0, str(HERE))  # for the sibling example train_resnet.py


L = _import_lightning()
if L is None:
    print("examples/train_lightning.py needs Lightning: `pip install lightning` (or pytorch-lightning); exiting")
    sys.exit(0)
LightningModule: Any = L.LightningModule

try:
    import feedfast
except ImportError:  # a source checkout that is not pip-installed: use the repository's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import feedfast

from train_resnet import REPO, demo_shards, make_model  # the sibling example  # noqa: E402


class ImageClassifier(LightningModule):
    """A ResNet trained with SGD on batches from a feedfast spec."""

    def __init__(self, spec: str, shards: str | list[str], batch_size: int, image_size: int | None,
                 num_classes: int = 1000, lr: float = 0.1) -> None:
        super().__init__()
        self.model = make_model(num_classes)
        self.spec, self.shards, self.batch_size, self.lr = spec, shards, batch_size, lr
        self.overrides = [f"pipeline.image[1].size={image_size}"] if image_size else []
        self.loader: feedfast.DataLoader | None = None

    def train_dataloader(self) -> feedfast.DataLoader:
        # Rank and world size come from torch.distributed, which Lightning has set up by now.
        self.loader = feedfast.DataLoader(self.spec, shards=self.shards, batch_size=self.batch_size, shuffle=True,
                                          device=self.device, overrides=self.overrides)
        return self.loader

    def on_train_epoch_start(self) -> None:
        # Not after a mid-epoch resume: the restored loader is already at this epoch, part-way through.
        if self.loader is not None and self.loader.epoch != self.current_epoch:
            self.loader.set_epoch(self.current_epoch)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, target = batch
        loss = torch.nn.functional.cross_entropy(self.model(images), target)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=1e-4)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", help="shard paths, glob or brace pattern (default: a small generated demo set)")
    p.add_argument("--spec", default=str(REPO / "pipelines" / "imagenet-train.yaml"))
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--devices", default="auto", help="Lightning's devices (e.g. 2 for two-GPU DDP)")
    p.add_argument("--ckpt-path", default=None, help="resume from this Lightning checkpoint")
    args = p.parse_args(argv)

    module = ImageClassifier(args.spec, args.shards or demo_shards(), args.batch_size, args.image_size)
    trainer = L.Trainer(max_epochs=args.epochs, limit_train_batches=args.steps or 1.0, devices=args.devices,
                        use_distributed_sampler=False, log_every_n_steps=1)
    trainer.fit(module, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
