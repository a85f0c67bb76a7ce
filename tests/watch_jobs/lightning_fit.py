"""A Lightning Trainer fit over plain torch DataLoaders (training and validation), for tests/test_cli_watch.py.

Nothing in it knows about feedfast; ``feedfast watch`` meters it from outside.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n: int, fetch_s: float) -> None:
        self.n, self.fetch_s = n, fetch_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.fetch_s)
        return torch.full((8,), float(index % 7)), index % 2


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(0.006)  # the step's compute
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.net(x)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Slow(4 * 45, 0.0015), batch_size=4)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Slow(4 * 6, 0.0005), batch_size=4)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=2)
    trainer.fit(Tiny())
    print("lightning: fit done")
