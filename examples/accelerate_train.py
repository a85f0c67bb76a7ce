"""Train with Hugging Face Accelerate on a feedfast loader: gradient accumulation, launch, resume.

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py --accumulate 4        # 2 GPUs
    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py --cpu                 # no GPU: gloo
    python examples/accelerate_train.py --cpu --steps 6 --batch-size 8 --image-size 64

(Without ``--multi_gpu`` and with no Accelerate config, ``accelerate launch --num_processes 2``
on a machine without GPUs starts one process; without ``--cpu`` there, each of two processes
is an Accelerator of its own, no process group: the loader still splits the epoch by
``RANK``/``WORLD_SIZE``, but gradients are not averaged.)

Accelerate needs nothing special from feedfast's loader:

- ``accelerate launch`` starts one process per rank with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
  set, as torchrun does; the ``Accelerator`` joins the process group, and the loader splits
  every epoch between the ranks as under torchrun (every sample once, equal batch counts).
- ``accelerator.prepare(loader)`` hands a feedfast loader back unchanged (it wraps torch
  DataLoaders only); batches already come on ``accelerator.device`` (passed as ``device=``).
- ``accelerator.accumulate(model)`` syncs gradients every ``--accumulate`` batches and on the
  epoch's last batch, as over a prepared torch DataLoader: the loader tells Accelerate's
  ``GradientState`` where its epoch ends (:mod:`feedfast.loader.accelerate_state`).
- ``accelerator.register_for_checkpointing(loader)`` saves and loads its JSON-safe state with
  ``save_state``/``load_state``; ``accelerator.skip_first_batches(loader, n)`` (``--skip``)
  yields the epoch's batches after the first ``n``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn

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
    p.add_argument("--steps", type=int, default=None, help="at most this many batches per epoch")
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--accumulate", type=int, default=4, help="batches per optimizer step")
    p.add_argument("--skip", type=int, default=0, help="skip the first epoch's first N batches")
    p.add_argument("--workers", type=int, default=None, help="loader threads per process")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--cpu", action="store_true", help="train on the CPU (gloo between processes)")
    p.add_argument("--state-dir", help="save the run's state here (accelerator.save_state) after each epoch")
    args = p.parse_args(argv)

    accelerator = Accelerator(gradient_accumulation_steps=args.accumulate, cpu=args.cpu)
    with accelerator.main_process_first():  # the first process writes the demo set, the others then read it
        shards: str | list[str] = args.shards or demo_shards()
    torch.manual_seed(0)
    model = make_model(args.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    overrides = [f"pipeline.image[1].size={args.image_size}"] if args.image_size else []
    loader = feedfast.DataLoader(args.spec, shards=shards, batch_size=args.batch_size, shuffle=True,
                                 num_workers=args.workers, device=accelerator.device, overrides=overrides)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(loader)
    criterion = nn.CrossEntropyLoss()
    rank, world = accelerator.process_index, accelerator.num_processes
    print(f"process {rank}/{world}: loader rank {loader.rank}/{loader.world}, {len(loader)} batches per epoch, "
          f"device {loader.device}", flush=True)

    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, args.skip) if epoch == 0 and args.skip else loader
        model.train()
        steps = syncs = samples = 0
        for images, target in batches:
            with accelerator.accumulate(model):
                loss = criterion(model(images), target)
                accelerator.backward(loss)
                optimizer.step()  # steps only when Accelerate syncs
                optimizer.zero_grad()
            syncs += accelerator.sync_gradients
            steps += 1
            samples += images.shape[0]
            if accelerator.is_main_process:
                print(f"epoch {epoch} step {steps} loss {loss.item():.4f} synced {accelerator.sync_gradients}",
                      flush=True)
            if steps == args.steps:
                break
        print(f"process {rank}/{world}: epoch {epoch}: {steps} batches, {syncs} gradient syncs, {samples} samples, "
              f"{loader.stats()['delivered']} delivered so far", flush=True)
        if args.state_dir:
            accelerator.save_state(args.state_dir)
    accelerator.end_training()


if __name__ == "__main__":
    main()
