"""The attributes torch training scripts read off a DataLoader, each with torch's meaning.

timm's ``_set_loader_epoch``, torchvision's ``evaluate()``, Accelerate's ``skip_first_batches``
and DDP loops (``loader.sampler.set_epoch(e)``) read a loader's ``dataset``, ``sampler``,
``batch_sampler``, ``batch_size``, ``drop_last``, ``num_workers``, ``pin_memory``,
``prefetch_factor``, ``persistent_workers``, ``timeout``, ``collate_fn`` and ``generator``.
:class:`TorchAttributes` gives :class:`feedfast.DataLoader` each of them. The rule behind
every value: **a torch DataLoader built from these attributes over** ``loader.dataset``
**yields the loader's batches**, the same samples in the same batches (Accelerate's
``skip_first_batches`` builds exactly that one).

==================  ==========================================================================
attribute           value
==================  ==========================================================================
dataset             :class:`LoaderDataset`: an ``IterableDataset`` of the loader's samples, one
                    at a time; ``len()`` = the epoch's samples over all ranks (torch's
                    ``len(dataset)``, what torchvision's ``evaluate()`` compares with the samples
                    it processed, summed over ranks); ``set_epoch(e)`` = ``loader.set_epoch(e)``
                    over an image folder read in place, ``classes`` and ``class_to_idx`` as
                    torchvision's ``ImageFolder`` has them
sampler             :class:`LoaderSampler`: ``set_epoch(e)``; ``len()`` = this rank's samples per
                    epoch (padding included, as ``DistributedSampler``'s); no indices to iterate
batch_sampler       :class:`LoaderBatchSampler`: ``set_epoch(e)``, ``batch_size``, ``drop_last``;
                    ``len()`` = ``len(loader)``; no indices to iterate
batch_size          the batch size (the spec's, or ``batch_size=``)
drop_last           True under ``last_batch: drop``
num_workers         worker processes: 0 for the ``dali`` and ``threads`` backends (their threads
                    run in this process: ``loader.threads``), the ``pil`` backend's processes
pin_memory          False: batches come out on their device (CUDA tensors there), never as
                    pinned host tensors; the staging ring's pinning is ``loader.ring.pin``
prefetch_factor     None with no worker processes (torch's rule), else batches ahead
                    (``loader.prefetch``: the loader's own lookahead on every backend)
persistent_workers  False: the ``pil`` backend starts its processes per epoch
timeout             seconds ``next()`` waits for a batch, 0 for ever (torch's default)
collate_fn          :class:`BatchCollate`: from a list of ``loader.dataset``'s samples to the
                    loader's batch (torch's ``default_collate``, in the loader's tuple or dict
                    form, then the user's ``collate_fn=``); under ``sample_info=True`` each
                    sample carries its row of the batch's info (:class:`RowInfo`) and the
                    batch gets its :class:`BatchInfo` back where the loader puts it
generator           None: order and augmentation come from ``seed=``, not a ``torch.Generator``
mixup_enabled       timm's ``PrefetchLoader`` switch: whether the spec's ``batch.mix`` mixes;
                    set False (timm's ``--mixup-off-epoch``) to stop mixing from the next batch
==================  ==========================================================================

``sampler`` and ``batch_sampler`` are objects with ``set_epoch``, not None as torch has them
for iterable datasets, so that the scripts calling ``loader.sampler.set_epoch(epoch)`` (the
``DistributedSampler`` idiom) run; iterating them raises a :class:`~feedfast.errors.UserError`
saying why (feedfast draws its order from (seed, epoch) inside the loader).

``collate_fn=`` of :class:`feedfast.DataLoader` is a batch hook (:mod:`feedfast.loader.batchhook`),
and ``loader.collate_fn`` what a torch DataLoader over ``loader.dataset`` needs to make the
loader's batches from its samples: both, as torch's, end where the batch is yielded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch.utils.data import IterableDataset, Sampler, default_collate

from feedfast.errors import FeedfastError, UserError
from feedfast.loader.batch import BatchInfo
from feedfast.loader.batchhook import BatchHook, run_batch_hook, with_info

INFO_KEY = "sample_info"  # where a dict batch holds its BatchInfo (feedfast.loader.batch.shape_outputs)

if TYPE_CHECKING:
    from feedfast.loader.dataloader import DataLoader

@dataclass(frozen=True)
class RowInfo:
    """One sample's share of its batch's :class:`BatchInfo` (``sample_info=True``): row ``row`` of ``batch``."""

    batch: BatchInfo
    row: int


def rows(batch: Any) -> Iterator[Any]:
    """The samples of a batch (a tuple or a dict of batched values), one at a time, in the batch's form.

    A batch's :class:`BatchInfo` (``sample_info=True``) is split too: each sample carries a
    :class:`RowInfo` where the batch carries its info, for :class:`BatchCollate` to join again.
    """
    if isinstance(batch, dict):
        info = batch.get(INFO_KEY)
        size = len(next(value for name, value in batch.items() if name != INFO_KEY))
        for i in range(size):
            sample = {name: value[i] for name, value in batch.items() if name != INFO_KEY}
            yield sample if not isinstance(info, BatchInfo) else {**sample, INFO_KEY: RowInfo(info, i)}
        return
    info = batch[-1] if isinstance(batch[-1], BatchInfo) else None
    values = batch[:-1] if info is not None else batch
    for i in range(len(values[0])):
        row = tuple(value[i] for value in values)
        yield row if info is None else (*row, RowInfo(info, i))


def join_info(parts: list[RowInfo]) -> BatchInfo:
    """The :class:`BatchInfo` of a batch made of these rows: their batch's own when they are all of it, in order,
    else one of these rows (epoch, step and state those of the last row's batch)."""
    first = parts[0].batch
    if all(p.batch is first for p in parts) and [p.row for p in parts] == list(range(len(first.origins))):
        return first
    last = parts[-1].batch
    valid = torch.stack([p.batch.valid[p.row] for p in parts])
    return replace(last, origins=tuple(p.batch.origins[p.row] for p in parts), valid=valid)


class BatchCollate:
    """``loader.collate_fn``, torch's meaning: a list of ``loader.dataset``'s samples to the loader's batch.

    torch's ``default_collate``, in the loader's form (a tuple, where ``default_collate`` gives a
    list), then the loader's batch hook (``hook``, the ``collate_fn=`` it was given) when there is one;
    then, under ``sample_info=True``, the batch's :class:`BatchInfo` joined from its samples' :class:`RowInfo`,
    where the loader puts it (the tuple's last element, or ``"sample_info"``).
    """

    def __init__(self, hook: BatchHook | None) -> None:
        self.hook = hook

    def __call__(self, samples: list[Any]) -> Any:  # noqa: D102 - documented on the class
        first = samples[0]
        if isinstance(first, dict) and isinstance(first.get(INFO_KEY), RowInfo):
            info = join_info([s[INFO_KEY] for s in samples])
            samples = [{k: v for k, v in s.items() if k != INFO_KEY} for s in samples]
        elif isinstance(first, tuple) and first and isinstance(first[-1], RowInfo):
            info = join_info([s[-1] for s in samples])
            samples = [s[:-1] for s in samples]
        else:
            info = None
        batch = default_collate(samples)
        if isinstance(samples[0], tuple):
            batch = tuple(batch)
        if self.hook is not None:
            batch = run_batch_hook(self.hook, batch, len(samples), "loader.collate_fn")
        return batch if info is None else with_info(batch, info)

    def __repr__(self) -> str:
        return f"BatchCollate(hook={self.hook!r})"


class LoaderDataset(IterableDataset):  # type: ignore[type-arg]
    """``loader.dataset``: the loader's samples as a torch ``IterableDataset``, one sample at a time.

    Iterating it iterates the loader (its epoch, order, resume point and state, before its batch
    hook) and yields each batch's samples in order, padding included, as the loader counts them;
    a torch DataLoader over it with the loader's ``batch_size`` and ``collate_fn`` yields the
    loader's batches. ``len()`` is the epoch's samples over all ranks (torch's ``len(dataset)``).

    Raises:
        UserError: iterated in a torch DataLoader worker process (every worker would read the
            whole epoch): build that DataLoader with ``num_workers=0``.
    """

    def __init__(self, loader: "DataLoader") -> None:
        self.loader = loader

    def __len__(self) -> int:
        return sum(self.loader.shards_for(self.loader.epoch).sizes)

    def set_epoch(self, epoch: int) -> None:
        """The loader's :meth:`~feedfast.DataLoader.set_epoch` (timm's ``_set_loader_epoch`` calls it)."""
        self.loader.set_epoch(epoch)

    @property
    def classes(self) -> list[str]:
        """The class names in label order, as torchvision's ``ImageFolder.classes`` (an image folder read in place).

        Raises:
            AttributeError: the dataset has no class names (shards, a file list): ``hasattr`` is False.
        """
        names = self.loader.shards.class_names
        if not names:
            raise AttributeError("classes: this dataset has no class names (only an image folder read in place has "
                                 "them, as torchvision's ImageFolder); its labels are numbers")
        return list(names)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as torchvision's ``ImageFolder.class_to_idx`` (see :attr:`classes`)."""
        return {name: i for i, name in enumerate(self.classes)}

    def __iter__(self) -> Iterator[Any]:
        if torch.utils.data.get_worker_info() is not None:
            raise UserError("feedfast's loader.dataset was iterated in a torch DataLoader worker process: each worker "
                            "would read the whole epoch (every sample once per worker); build that DataLoader with "
                            "num_workers=0 (feedfast makes batches in its own threads), or iterate the loader itself")
        for batch in self.loader._iterate(hooked=False):
            yield from rows(batch)

    def __repr__(self) -> str:
        return f"LoaderDataset({len(self)} samples, epoch {self.loader.epoch})"


def _no_indices(what: str) -> FeedfastError:
    return UserError(f"feedfast's loader.{what} has set_epoch() and len() but no indices to iterate: the loader "
                     "draws its order from (seed, epoch) itself; iterate the loader, or loader.dataset")


class LoaderSampler(Sampler[int]):
    """``loader.sampler``: ``set_epoch`` sets the loader's epoch; ``len()`` is this rank's samples per epoch."""

    def __init__(self, loader: "DataLoader") -> None:
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        """The loader's :meth:`~feedfast.DataLoader.set_epoch` (the ``DistributedSampler`` idiom)."""
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return sum(self.loader.epoch_plan().batch_sizes)

    def __iter__(self) -> Iterator[int]:
        raise _no_indices("sampler")


class LoaderBatchSampler(Sampler[list[int]]):
    """``loader.batch_sampler``: ``set_epoch``, ``batch_size``, ``drop_last``, ``sampler``; ``len()`` is ``len(loader)``."""

    def __init__(self, loader: "DataLoader") -> None:
        self.loader = loader
        self.sampler = LoaderSampler(loader)

    @property
    def batch_size(self) -> int:
        """The loader's batch size."""
        return self.loader.batch_size

    @property
    def drop_last(self) -> bool:
        """The loader's ``drop_last``."""
        return self.loader.drop_last

    def set_epoch(self, epoch: int) -> None:
        """The loader's :meth:`~feedfast.DataLoader.set_epoch`."""
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[list[int]]:
        raise _no_indices("batch_sampler")


class TorchAttributes:
    """The torch DataLoader attributes of :class:`feedfast.DataLoader` (see the module's table)."""

    spec: Any
    backend: str
    _backend: Any
    _batch_mix: Any
    prefetch: int
    settings: Any

    @property
    def dataset(self) -> LoaderDataset:
        """The loader's samples as an ``IterableDataset`` (see :class:`LoaderDataset`)."""
        return LoaderDataset(self)  # type: ignore[arg-type]

    @property
    def sampler(self) -> LoaderSampler:
        """An object with ``set_epoch`` and ``len()`` (see :class:`LoaderSampler`)."""
        return LoaderSampler(self)  # type: ignore[arg-type]

    @property
    def batch_sampler(self) -> LoaderBatchSampler:
        """An object with ``set_epoch``, ``batch_size``, ``drop_last`` and ``len()`` (see :class:`LoaderBatchSampler`)."""
        return LoaderBatchSampler(self)  # type: ignore[arg-type]

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return int(self.spec.batch_size)

    @property
    def drop_last(self) -> bool:
        """Whether incomplete batches are dropped (``last_batch: drop``)."""
        return bool(self.spec.last_batch == "drop")

    @property
    def num_workers(self) -> int:
        """Worker processes: the ``pil`` backend's, else 0 (the other backends' threads run in this process)."""
        return int(self._backend.worker_processes)

    @property
    def pin_memory(self) -> bool:
        """False: batches are delivered on their device, never as pinned host tensors."""
        return False

    @property
    def prefetch_factor(self) -> int | None:
        """None without worker processes (torch's rule), else the batches made ahead."""
        return self.prefetch if self.num_workers > 0 else None

    @property
    def persistent_workers(self) -> bool:
        """False: there are no worker processes, or (``pil``) they are started per epoch."""
        return False

    @property
    def timeout(self) -> float:
        """Seconds ``next()`` waits for a batch; 0: for ever."""
        return self.settings.wait_s or 0

    @property
    def collate_fn(self) -> BatchCollate:
        """From a list of ``dataset``'s samples to the loader's batch (see :class:`BatchCollate`)."""
        return BatchCollate(self.settings.hook)

    @property
    def generator(self) -> None:
        """None: order and augmentation follow ``seed``."""
        return None

    @property
    def mixup_enabled(self) -> bool:
        """Whether the spec's ``batch.mix`` mixes batches (False without one); timm's ``PrefetchLoader`` attribute.

        Setting it False (timm's ``train.py`` does at ``--mixup-off-epoch``) stops the mix from the next
        batch made: targets stay soft, each sample's own smoothed one-hot. Batches already made ahead
        (``prefetch_factor``) keep their mix.

        Raises:
            UserError: set True on a spec without ``batch.mix``.
        """
        return self._batch_mix is not None and self._batch_mix.enabled

    @mixup_enabled.setter
    def mixup_enabled(self, on: bool) -> None:
        if self._batch_mix is None:
            if on:
                raise UserError(f"mixup_enabled = True: spec {self.spec.name!r} has no batch.mix to turn on; add "
                                "batch.mix (mixup_alpha, cutmix_alpha, num_classes) to the spec")
            return
        self._batch_mix.enabled = bool(on)
