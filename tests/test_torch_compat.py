"""The attributes torch training scripts read, replayed along the paths those scripts take.

timm's ``train.py`` and torchvision's ``references/classification/train.py`` are not in this
repository: each test replays the lines of theirs that touch the loader (quoted where they are
copied), on a feedfast loader. Lines cited as "timm train.py:N" are of
huggingface/pytorch-image-models at aa4b5850; "torchvision train.py:N" and "utils.py" of
pytorch/vision's references/classification at 017e9b99. Both scripts were also run whole, two
epochs on feedfast-made shards, with docs/swap.md's swap (see that page).
"""

from __future__ import annotations

import itertools
import threading
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import default_collate

import feedfast
from feedfast.errors import FeedfastError, UserError
from feedfast.loader.torchcompat import BatchCollate, LoaderBatchSampler, LoaderSampler
from tests.helpers import FakeGpu, extra, keys_of_epoch


def _loader(spec: dict, shards: list[str], **kw: Any) -> feedfast.DataLoader:
    kw.setdefault("num_workers", 2)
    return feedfast.DataLoader(spec, shards=shards, **kw)


def _keys(loader: feedfast.DataLoader, batches: Any) -> list[list[str]]:
    out = []
    for _ in batches:
        out.append([k for _, k in loader.last_origins])
    return out


# timm train.py:478-484, verbatim (Apache-2.0, huggingface/pytorch-image-models)
def _set_loader_epoch(loader: Any, epoch: int) -> None:
    if hasattr(loader.dataset, 'set_epoch'):
        loader.dataset.set_epoch(epoch)
    if hasattr(loader.batch_sampler, 'set_epoch'):
        loader.batch_sampler.set_epoch(epoch)
    elif hasattr(loader.sampler, 'set_epoch'):
        loader.sampler.set_epoch(epoch)


def test_attributes_have_torchs_meaning(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, timeout=30, persistent_workers=True, prefetch_factor=3)
    assert (loader.batch_size, loader.drop_last, loader.num_workers) == (4, False, 0)  # threads, no processes
    assert (loader.pin_memory, loader.prefetch_factor, loader.persistent_workers) == (False, None, False)
    assert (loader.timeout, loader.generator) == (30.0, None)
    assert isinstance(loader.collate_fn, BatchCollate) and loader.collate_fn.hook is None
    assert len(loader.dataset) == 23 and isinstance(loader.dataset, torch.utils.data.IterableDataset)
    assert isinstance(loader.sampler, LoaderSampler) and len(loader.sampler) == 23
    assert isinstance(loader.batch_sampler, LoaderBatchSampler) and len(loader.batch_sampler) == len(loader) == 6
    assert (loader.batch_sampler.batch_size, loader.batch_sampler.drop_last) == (4, False)
    assert _loader(small_spec, shards).timeout == 0
    dropping = _loader(small_spec, shards, drop_last=True)
    assert dropping.drop_last and dropping.batch_sampler.drop_last and len(dropping.batch_sampler) == 5
    with pytest.raises(UserError, match="no indices to iterate"):
        iter(loader.sampler).__next__()
    with pytest.raises(UserError, match="no indices to iterate"):
        list(loader.batch_sampler)


def test_pil_backend_reports_its_worker_processes(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, backend="pil", num_workers=2, prefetch_factor=3)
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 3, False)


def test_dataset_length_is_the_epochs_samples_over_all_ranks(small_spec: dict, shards: list[str]) -> None:
    ranks = [_loader(small_spec, shards, rank=r, world_size=2) for r in range(2)]
    assert [len(r.dataset) for r in ranks] == [23, 23]  # torch's len(dataset): the whole dataset
    assert [len(r.sampler) for r in ranks] == [12, 12]  # DistributedSampler's: this rank's, padding included
    rows = [sum(x.shape[0] for x, _ in r) for r in ranks]
    assert rows == [12, 12] and sum(r.stats()["delivered"] for r in ranks) == 23  # one padded row, counted


def test_timm_set_loader_epoch_sets_the_epoch(small_spec: dict, shards: list[str]) -> None:
    reference = _loader(small_spec, shards, shuffle=True)
    reference.set_epoch(3)
    expected = keys_of_epoch(reference)
    loader = _loader(small_spec, shards, shuffle=True)
    _set_loader_epoch(loader, 3)
    assert loader.epoch == 3 and keys_of_epoch(loader) == expected
    loader.sampler.set_epoch(3)  # the DistributedSampler idiom of DDP scripts
    assert loader.epoch == 3 and keys_of_epoch(loader) == expected


def test_timm_train_one_epoch_with_mixup_as_the_batch_hook(small_spec: dict, shards: list[str]) -> None:
    """timm's Mixup contract, ``mixup_fn(input, target) -> (mixed input, soft target)``, given as the hook."""
    threads: list[str] = []

    def mixup_fn(x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        threads.append(threading.current_thread().name)
        lam = 0.7
        soft = torch.nn.functional.one_hot(target, 10).float()
        return lam * x + (1 - lam) * x.flip(0), lam * soft + (1 - lam) * soft.flip(0)

    plain = [(x.clone(), y.clone()) for x, y in _loader(small_spec, shards, drop_last=True)]
    loader = _loader(small_spec, shards, drop_last=True, collate_fn=lambda batch: mixup_fn(*batch))
    # timm train_one_epoch: len(loader) for the accumulation bookkeeping, then enumerate(loader)
    last_batch_idx = len(loader) - 1
    seen = 0
    for batch_idx, (input, target) in enumerate(loader):
        x, y = plain[batch_idx]
        assert target.shape == (4, 10) and torch.allclose(target.sum(1), torch.ones(4))
        torch.testing.assert_close(input, 0.7 * x + 0.3 * x.flip(0))
        seen = batch_idx
    assert seen == last_batch_idx == 4
    assert threads and all(name.startswith("feedfast-rank0") for name in threads)  # the producer, not this thread


def test_torchvision_evaluate_compares_the_dataset_length_with_the_samples_processed(small_spec: dict,
                                                                                      shards: list[str]) -> None:
    data_loader = _loader(small_spec, shards)
    num_processed_samples = 0
    for image, _target in data_loader:  # torchvision evaluate(), one process: no reduce_across_processes
        num_processed_samples += image.shape[0]
    # a mismatch would call torch.distributed.get_rank(), which raises without a process group
    assert hasattr(data_loader.dataset, "__len__") and len(data_loader.dataset) == num_processed_samples == 23


def test_torchvision_mixup_collate_given_unchanged_is_refused_with_why(small_spec: dict, shards: list[str]) -> None:
    def mixupcutmix(images: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return images, target

    # torchvision train.py: collate_fn = lambda batch: mixupcutmix(*default_collate(batch))
    loader = _loader(small_spec, shards, collate_fn=lambda batch: mixupcutmix(*default_collate(batch)))
    with pytest.raises(FeedfastError, match="receives the finished batch"):
        next(iter(loader))
    fixed = _loader(small_spec, shards, collate_fn=lambda batch: mixupcutmix(*batch))  # docs/swap.md's swap
    assert [x.shape[0] for x, _ in fixed] == [4, 4, 4, 4, 4, 3]
    # torch's default, passed along by a script that swapped only its loader, means no hook: the same batches
    plain = [torch.equal(a, b) for (a, _), (b, _) in zip(_loader(small_spec, shards, collate_fn=default_collate),
                                                          _loader(small_spec, shards))]
    assert plain == [True] * 6


def test_a_hook_that_changes_the_samples_is_refused(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, collate_fn=lambda batch: (batch[0][:2], batch[1][:2]))
    with pytest.raises(FeedfastError, match="must keep the batch's samples"):
        next(iter(loader))


def test_hook_runs_on_the_side_stream_and_the_training_stream_waits_for_it(monkeypatch: pytest.MonkeyPatch,
                                                                           small_spec: dict,
                                                                           shards: list[str]) -> None:
    import feedfast.loader.dataloader as dl
    from feedfast.loader.devices import Route

    gpu = FakeGpu()
    streams: list[str] = []

    def hook(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        streams.append(gpu.active)
        return batch[0] * 2, batch[1]

    monkeypatch.setattr(dl, "route_here", lambda placement, device: Route("cpu", torch.device("cuda", 0), None))
    monkeypatch.setattr(dl.DataLoader, "_layer", lambda self: gpu)
    loader = feedfast.DataLoader(small_spec, shards=shards, num_workers=2, collate_fn=hook)
    got = list(loader)
    side = loader.ring.stream.name
    assert len(got) == 6 and streams == [side] * 6
    waited = [op[2] for op in gpu.log if op[0] == "wait_event" and op[1] == "training"]
    recorded = {op[2]: i for i, op in enumerate(gpu.log) if op[0] == "record"}
    assert len(waited) == 6
    for event in waited:  # each waited-for event was recorded on the side stream after the hook's copies
        assert gpu.log[recorded[event]][1] == side
    assert not any(op[0] in ("synchronize", "host_sync") for op in gpu.log)


def test_sample_info_comes_after_the_hook(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, sample_info=True, collate_fn=lambda batch: (batch[0], batch[1] + 100))
    images, labels, info = next(iter(loader))
    assert bool((labels >= 100).all()) and info.step == 0 and len(info.origins) == 4


def test_a_torch_dataloader_over_loader_dataset_yields_the_loaders_batches(small_spec: dict,
                                                                          shards: list[str]) -> None:
    def hook(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch[0], batch[1] * 10

    expected = [(x.clone(), y.clone()) for x, y in _loader(small_spec, shards, shuffle=True, collate_fn=hook)]
    loader = _loader(small_spec, shards, shuffle=True, collate_fn=hook)
    rebuilt = torch.utils.data.DataLoader(loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last,
                                          num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                                          pin_memory=loader.pin_memory, timeout=loader.timeout,
                                          prefetch_factor=loader.prefetch_factor, generator=loader.generator,
                                          persistent_workers=loader.persistent_workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note that len() of an IterableDataset's loader is an estimate
        got = list(rebuilt)
    assert len(got) == len(expected) == 6
    for (x, y), (ex, ey) in zip(got, expected):
        assert isinstance(x, torch.Tensor) and torch.equal(x, ex) and torch.equal(y, ey)
    assert loader.epoch == 1  # the dataset is the loader: its epoch moved on


def test_loader_dataset_in_torch_worker_processes_is_refused_with_why(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards)
    rebuilt = torch.utils.data.DataLoader(loader.dataset, batch_size=4, num_workers=1)
    with pytest.raises(UserError, match="num_workers=0"):
        next(iter(rebuilt))


def test_a_partial_epoch_ends_it_and_the_next_iter_runs_the_next_epoch(small_spec: dict, shards: list[str]) -> None:
    reference = _loader(small_spec, shards, shuffle=True)
    epoch0 = _keys(reference, reference)
    epoch1 = _keys(reference, reference)
    loader = _loader(small_spec, shards, shuffle=True)
    assert _keys(loader, itertools.islice(loader, 3)) == epoch0[:3]
    state = loader.state_dict()
    assert loader.epoch == 0 and state["step"] == 3  # the stopped iteration's state is kept
    full = _keys(loader, loader)
    assert full == epoch1 and len(full) == len(loader) and loader.epoch == 2  # a new epoch, a new order
    resumed = _loader(small_spec, shards, shuffle=True)
    resumed.load_state_dict(state)
    assert _keys(resumed, resumed) == epoch0[3:]  # a state taken after islice resumes where it stopped


def test_set_epoch_after_a_partial_epoch_runs_that_epoch_from_its_start(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, shuffle=True)
    first = _keys(loader, itertools.islice(loader, 2))
    loader.set_epoch(0)
    again = _keys(loader, loader)
    assert again[:2] == first and len(again) == 6 and loader.epoch == 1


def test_timm_train_one_epoch_accumulation_bookkeeping_meets_every_batch(small_spec: dict, shards: list[str]) -> None:
    """timm train.py:1267-1281 with --grad-accum-steps 4: the counts come from len(loader), the loop from enumerate."""
    loader = _loader(small_spec, shards, shuffle=True, drop_last=True)
    accum_steps = 4
    last_accum_steps = len(loader) % accum_steps
    updates_per_epoch = (len(loader) + accum_steps - 1) // accum_steps
    last_batch_idx = len(loader) - 1
    last_batch_idx_to_accum = len(loader) - last_accum_steps
    updates, last_seen, sizes = 0, False, []
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        if batch_idx >= last_batch_idx_to_accum:
            accum_steps = last_accum_steps
        updates += need_update
        last_seen |= last_batch
        sizes.append((input.shape[0], target.shape[0], accum_steps))
    # 23 samples in batches of 4, the partial one dropped: 5 batches, 2 updates, the last of one batch
    assert last_seen and updates == updates_per_epoch == 2
    assert sizes == [(4, 4, 4)] * 4 + [(4, 4, 1)]


def test_timm_validate_reaches_its_last_index(small_spec: dict, shards: list[str]) -> None:
    """timm train.py:1474-1477: ``last_idx = len(loader) - 1``, then ``batch_idx == last_idx`` logs the totals."""
    loader = _loader(small_spec, shards)
    last_idx = len(loader) - 1
    seen = [batch_idx == last_idx for batch_idx, (input, target) in enumerate(loader)]
    assert seen == [False] * 5 + [True]


def test_timm_mixup_in_its_training_loop_over_feedfast_batches(small_spec: dict, shards: list[str]) -> None:
    """timm train.py:1283-1286 with --no-prefetcher: the batch is moved, then timm's own Mixup mixes it.

    timm's ``Mixup`` needs an even batch (``drop_last=True``, as docs/swap.md's swap gives) and yields
    soft targets for ``SoftTargetCrossEntropy``; with the prefetcher timm would mix in its collate
    function instead (``FastCollateMixup``, a per-sample collate), which a feedfast loader cannot take.
    """
    Mixup = extra("timm.data.mixup").Mixup  # the `test` extra
    SoftTargetCrossEntropy = extra("timm.loss").SoftTargetCrossEntropy

    mixup_fn = Mixup(mixup_alpha=0.2, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode="batch",
                                label_smoothing=0.1, num_classes=10)
    loss_fn = SoftTargetCrossEntropy()
    device, model_dtype = torch.device("cpu"), None
    loader = _loader(small_spec, shards, shuffle=True, drop_last=True, device=device)
    losses = []
    for batch_idx, (input, target) in enumerate(loader):  # noqa: B007 - as timm writes it
        input, target = input.to(device=device, dtype=model_dtype), target.to(device=device)
        input, target = mixup_fn(input, target)
        assert input.shape == (4, 3, 32, 32) and target.shape == (4, 10)
        torch.testing.assert_close(target.sum(1), torch.ones(4))
        losses.append(float(loss_fn(torch.zeros(4, 10), target)))
    assert len(losses) == len(loader) == 5 and all(v == pytest.approx(2.302585, abs=1e-4) for v in losses)


def test_torchvision_log_every_and_evaluate_as_written(small_spec: dict, shards: list[str]) -> None:
    """torchvision utils.py MetricLogger.log_every (``len(iterable)`` for its format and ETA, then the loop) and
    train.py:88-101: ``reduce_across_processes`` returns a tensor, compared with ``len(data_loader.dataset)``;
    a mismatch would call ``torch.distributed.get_rank()``, which raises without a process group."""
    data_loader_test = _loader(small_spec, shards)
    space_fmt = ":" + str(len(str(len(data_loader_test)))) + "d"
    assert space_fmt == ":1d"
    num_processed_samples = 0
    for i, (image, target) in enumerate(data_loader_test):  # noqa: B007 - as torchvision writes it
        assert ("[{0" + space_fmt + "}/{1}]").format(i, len(data_loader_test)) == f"[{i}/6]"
        num_processed_samples += image.shape[0]
    num_processed_samples = torch.tensor(num_processed_samples)  # reduce_across_processes, one process
    mismatch = (hasattr(data_loader_test.dataset, "__len__")
                and len(data_loader_test.dataset) != num_processed_samples)
    assert not mismatch and int(num_processed_samples) == 23


def test_torchvision_train_sampler_of_the_swap_moves_the_loader_to_each_epoch(small_spec: dict,
                                                                              shards: list[str]) -> None:
    """docs/swap.md's torchvision swap sets ``train_sampler = data_loader.sampler``; train.py:340-343 then runs
    ``if args.distributed: train_sampler.set_epoch(epoch)`` before each ``train_one_epoch``."""
    reference = _loader(small_spec, shards, shuffle=True)
    epochs = [keys_of_epoch(reference) for _ in range(3)]
    data_loader = _loader(small_spec, shards, shuffle=True)
    train_sampler = data_loader.sampler
    for epoch in range(1, 3):  # --resume from the checkpoint of epoch 0: args.start_epoch = 1
        train_sampler.set_epoch(epoch)
        assert keys_of_epoch(data_loader) == epochs[epoch]


def test_torchvision_v2_mixup_cutmix_as_the_batch_hook(small_spec: dict, shards: list[str]) -> None:
    """torchvision's current get_mixup_cutmix (v2 MixUp / CutMix in a RandomChoice), given the finished batch
    as docs/swap.md's swap does: ``collate_fn=lambda batch: mixup_cutmix(*batch)``."""
    v2 = extra("torchvision.transforms.v2")
    mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=10), v2.CutMix(alpha=1.0, num_classes=10)])
    data_loader = _loader(small_spec, shards, shuffle=True,
                          collate_fn=(lambda batch: mixup_cutmix(*batch)) if mixup_cutmix is not None else None)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    shapes = []
    for image, target in data_loader:
        shapes.append((image.shape[0], tuple(target.shape[1:])))
        torch.testing.assert_close(target.sum(1), torch.ones(image.shape[0]))
        assert torch.isfinite(criterion(torch.zeros(image.shape[0], 10), target))
    assert shapes == [(4, (10,))] * 5 + [(3, (10,))]


def test_timm_mixup_off_epoch_turns_the_spec_mix_off(small_spec: dict, shards: list[str]) -> None:
    """timm train.py:1251-1255 with its prefetcher and --mixup-off-epoch: ``loader.mixup_enabled`` is read and
    set False; from then on the targets are each sample's own smoothed one-hot and the pixels unmixed."""
    import argparse
    import copy

    spec = copy.deepcopy(small_spec)
    spec["batch"]["mix"] = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "num_classes": 10, "label_smoothing": 0.1}
    plain = [x.clone() for x, _ in _loader(small_spec, shards, backend="threads", num_workers=2)]
    loader = _loader(spec, shards, backend="threads", num_workers=2, prefetch_factor=1)
    args, mixup_fn, epoch = argparse.Namespace(mixup_off_epoch=1, prefetcher=True), None, 1
    assert loader.mixup_enabled
    # timm train.py:1251-1255, verbatim
    if args.mixup_off_epoch and epoch >= args.mixup_off_epoch:
        if args.prefetcher and loader.mixup_enabled:
            loader.mixup_enabled = False
        elif mixup_fn is not None:
            mixup_fn.mixup_enabled = False
    assert not loader.mixup_enabled
    batches = [(x.clone(), y.clone()) for x, y in loader]
    assert all(torch.equal(x, x0) for (x, _), x0 in zip(batches, plain))
    for _, y in batches:
        assert y.shape[1] == 10 and torch.allclose(y.max(1).values, torch.full((len(y),), 0.9 + 0.01))


def test_mixup_enabled_without_a_batch_mix(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, backend="threads")
    assert loader.mixup_enabled is False
    loader.mixup_enabled = False  # nothing to turn off
    with pytest.raises(UserError, match="batch.mix"):
        loader.mixup_enabled = True
