"""One Lightning training run over feedfast, for tests/test_lightning.py (run as a script).

A linear model on 32 px images, trained with ``lightning.Trainer`` on the CPU. Every training
step appends what it trained on (epoch, step, rank, sample keys, labels, a digest of the
pixels) to ``--record``; ``--save-at N`` saves a checkpoint after global step N and trains on;
``--ckpt-path`` resumes from one. The module is the example's wiring
(``examples/train_lightning.py``: ``LoaderStateHooks``, ``set_epoch`` per epoch), so the test
checks what users copy. ``--devices 2`` runs DDP on gloo: Lightning starts the second process
by running this script again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import lightning as L  # noqa: E402
from train_lightning import LoaderStateHooks  # noqa: E402

import feedfast  # noqa: E402


class SaveAt(L.Callback):
    """Save a checkpoint after global step ``step`` (on every rank: rank 0 writes it)."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


class Tiny(LoaderStateHooks, L.LightningModule):
    def __init__(self, spec: str, shards: list[str], log: str) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3 * 32 * 32, 10)
        self.spec, self.shards, self.log_path = spec, shards, log
        self.loader: feedfast.DataLoader | None = None

    def train_dataloader(self) -> feedfast.DataLoader:
        self.loader = feedfast.DataLoader(self.spec, shards=self.shards, shuffle=True, device="cpu", num_workers=1)
        return self.loader

    def on_train_epoch_start(self) -> None:
        if self.loader is not None and self.loader.epoch != self.current_epoch:
            self.loader.set_epoch(self.current_epoch)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        assert self.loader is not None
        # the batch just handed over: Lightning fetches none ahead of a loader with a length
        origins, valid = self.loader.last_origins, self.loader.last_valid
        record = {"epoch": self.current_epoch, "step": batch_idx, "rank": self.global_rank,
                  "keys": [key for _, key in origins[:valid]], "labels": labels.tolist(),
                  "pixels": hashlib.sha1(images.contiguous().numpy().tobytes()).hexdigest()}
        with open(self.log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        return torch.nn.functional.cross_entropy(self.net(images.flatten(1)), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--shards", required=True, help="comma-separated")
    p.add_argument("--record", required=True, help="JSON lines, one per training step (all ranks append)")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--ckpt", default=None, help="where --save-at writes")
    p.add_argument("--ckpt-path", default=None, help="resume from this checkpoint")
    args = p.parse_args()
    callbacks = [SaveAt(args.save_at, args.ckpt)] if args.save_at is not None else []
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                        max_epochs=2, use_distributed_sampler=False, callbacks=callbacks, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(Tiny(args.spec, args.shards.split(","), args.record), ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
