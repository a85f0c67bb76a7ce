"""A map-style torch Dataset over WebDataset tar shards, read through feedfast's shard indexes.

Sample ``i`` is the ``i``-th sample of the shards in the given order, as the indexes list
them. ``__getitem__`` reads the image and the label member with one ``pread`` each, decodes
the image with PIL (``Image.open(...).convert("RGB")``, as torchvision's ``ImageFolder``
loader does), applies the transform and returns ``(image, label)``. Each process (the main
one, each DataLoader worker) opens the shards it reads once and keeps them open.

Samples without an image or a label member are left out of the dataset and counted in
:attr:`ShardSamples.missing` (a warning says how many).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch.utils.data
from PIL import Image

from feedfast._env import cache_dir
from feedfast.errors import SampleError, UserError
from feedfast.shards.index.tarindex import Sample, first_member, load_index, read_index


class ShardSamples(torch.utils.data.Dataset):
    """``(transform(image), label)`` for every complete sample of the shards.

    Args:
        shards: local tar paths.
        index_paths: their index files (feedfast's, possibly filtered); None builds or reuses
            each shard's own index.
        image_exts: extensions that hold the image, first match in tar order wins.
        label_ext: the extension of the ASCII decimal class index.
        transform: applied to the RGB PIL image.
    """

    def __init__(self, shards: Sequence[str], index_paths: Sequence[str] | None, *, image_exts: frozenset[str],
                 label_ext: str, transform: Callable[[Image.Image], Any]) -> None:
        if index_paths is not None and len(index_paths) != len(shards):
            raise UserError(f"index_paths must match shards one to one, got {len(index_paths)} for {len(shards)}")
        self.shards = tuple(shards)
        self.transform = transform
        self.missing: list[tuple[str, str]] = []
        rows: list[tuple[int, int, int, int, int]] = []
        for number, shard in enumerate(self.shards):
            samples = _samples(shard, None if index_paths is None else index_paths[number])
            rows += self._rows(number, samples, image_exts, frozenset({label_ext.lower()}))
        if not rows:
            raise UserError(f"no sample of the {len(self.shards)} shard(s) has both an image "
                            f"({';'.join(sorted(image_exts))}) and a label ({label_ext})")
        if self.missing:
            warnings.warn(f"{len(self.missing)} sample(s) lack an image or a label and are left out "
                          f"(first: {self.missing[0]})", RuntimeWarning, stacklevel=2)
        self._rows_array = np.asarray(rows, dtype=np.int64)
        self._files: dict[int, int] = {}

    def _rows(self, number: int, samples: list[Sample], image_exts: frozenset[str],
              label_exts: frozenset[str]) -> list[tuple[int, int, int, int, int]]:
        rows = []
        for sample in samples:
            image, label = first_member(sample, image_exts), first_member(sample, label_exts)
            if image is None or label is None:
                self.missing.append((self.shards[number], sample.key))
                continue
            rows.append((number, image.offset, image.size, label.offset, label.size))
        return rows

    def __len__(self) -> int:
        return len(self._rows_array)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        number, image_at, image_size, label_at, label_size = (int(v) for v in self._rows_array[index])
        fd = self._fd(number)
        with Image.open(io.BytesIO(os.pread(fd, image_size, image_at))) as img:
            rgb = img.convert("RGB")
        raw = os.pread(fd, label_size, label_at)
        try:
            label = int(raw)
        except ValueError:
            raise SampleError("label is not an integer", shard=self.shards[number], key=f"#{index}",
                              reason=repr(raw[:40])) from None
        return self.transform(rgb), label

    def _fd(self, number: int) -> int:
        fd = self._files.get(number)
        if fd is None:
            fd = self._files[number] = os.open(self.shards[number], os.O_RDONLY)
        return fd

    def close(self) -> None:
        """Close the shards this process opened (reading again reopens them)."""
        files, self._files = getattr(self, "_files", {}), {}
        for fd in files.values():
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": {}}  # descriptors stay in the process that opened them

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, TypeError):  # already closed, or at interpreter exit with ``os`` torn down
            pass


def _samples(shard: str, index_path: str | None) -> list[Sample]:
    if not os.path.isfile(shard):
        raise UserError(f"the torchvision baseline reads local tar files; not a file: {shard!r}")
    if index_path is None:
        return load_index(shard, cache_dir())[1]
    return read_index(index_path, shard)
