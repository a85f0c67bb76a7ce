"""The DataLoader replacement and the pinned-memory prefetch ring."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from feedfast.loader.dataloader import DataLoader

__all__ = ["DataLoader"]


def __getattr__(name: str) -> object:
    """``DataLoader`` imported when first used: it needs torch, which the loader's light modules (the backend
    choice, the batch plan) and the CLI's parser and ``shards`` commands do not."""
    if name != "DataLoader":
        raise AttributeError(f"module 'feedfast.loader' has no attribute {name!r}")
    from feedfast.loader.dataloader import DataLoader

    globals()["DataLoader"] = DataLoader
    return DataLoader
