"""PyTorch Lightning with feedfast: ``train_dataloader`` returns a ``feedfast.DataLoader``.

    pip install 'feedfast[dev]'   # or: pip install lightning (check that it keeps your torch build)
    python examples/train_lightning.py --steps 5 --batch-size 8 --image-size 64
    python examples/train_lightning.py --epochs 2 --save-every 3 --ckpt-dir ckpts   # a checkpoint every 3 steps
    python examples/train_lightning.py --epochs 2 --ckpt-path ckpts/step=3.ckpt     # resume mid-epoch

What differs from a torch DataLoader:

* Lightning calls ``set_epoch`` only on a loader's ``sampler``, which feedfast's loader has
  not, so ``on_train_epoch_start`` calls it.
* Lightning must not wrap the loader in a ``DistributedSampler``; feedfast splits each epoch
  over ranks itself (``Trainer(use_distributed_sampler=False)``).
* Checkpoints: Lightning saves the state of a loader that has ``state_dict`` and
  ``load_state_dict`` and restores it on ``fit(ckpt_path=...)``, mid-epoch included. The
  state is exact: Lightning fetches no batch ahead of a loader that has a length, and
  feedfast's ``state_dict()`` is the point after the last batch it handed over. But Lightning
  writes rank 0's state only, and a feedfast state belongs to its rank (its shards, its DALI
  reader position; another rank's is refused), so :class:`LoaderStateHooks` gathers every
  rank's state into the checkpoint and hands each rank its own on resume. With one process it
  changes nothing. ``tests/test_lightning.py`` checks that a resumed run trains on exactly the
  samples the uninterrupted run trained on after the checkpoint, with one process and with two
  DDP processes (Lightning 2.6).
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

LOADER_STATES = "feedfast_loader_states"  # the checkpoint key of every rank's loader state


class LoaderStateHooks:
    """LightningModule hooks that keep every rank's feedfast loader state in the checkpoint.

    Mix in before ``LightningModule``; the module keeps the loader it returns from
    ``train_dataloader`` in ``self.loader``.
    """

    loader: feedfast.DataLoader | None
    trainer: Any
    global_rank: int

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Every rank dumps the checkpoint (rank 0 writes it), so gathering here is safe.
        state = self.loader.state_dict() if self.loader is not None else None
        states: list[Any] = [state]
        if self.trainer.world_size > 1:
            states = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(states, state)
        checkpoint[LOADER_STATES] = states

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Runs before Lightning restores its loops: put this rank's state where the fit loop reads it.
        states = checkpoint.get(LOADER_STATES)
        if not states:
            return
        if len(states) != self.trainer.world_size:
            raise feedfast.UserError(
                f"this checkpoint holds the loader states of {len(states)} ranks and this run has "
                f"{self.trainer.world_size}: resume a feedfast epoch on the world size it was saved with")
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        if "combined_loader" in fit_loop:
            fit_loop["combined_loader"] = [states[self.global_rank]]


class ImageClassifier(LoaderStateHooks, LightningModule):
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
    p.add_argument("--save-every", type=int, default=None, help="also save a checkpoint every N training steps")
    p.add_argument("--ckpt-dir", default="checkpoints", help="where --save-every writes step=N.ckpt")
    args = p.parse_args(argv)

    module = ImageClassifier(args.spec, args.shards or demo_shards(), args.batch_size, args.image_size)
    callbacks = []
    if args.save_every:
        checkpoint = getattr(L, "pytorch", L).callbacks.ModelCheckpoint  # lightning or pytorch_lightning
        callbacks.append(checkpoint(dirpath=args.ckpt_dir, filename="{step}", save_top_k=-1,
                                    every_n_train_steps=args.save_every))
    trainer = L.Trainer(max_epochs=args.epochs, limit_train_batches=args.steps or 1.0, devices=args.devices,
                        use_distributed_sampler=False, log_every_n_steps=1, callbacks=callbacks)
    trainer.fit(module, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
