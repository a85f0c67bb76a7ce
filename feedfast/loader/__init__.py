"""The DataLoader replacement and the pinned-memory prefetch ring."""

from feedfast.loader.dataloader import DataLoader

__all__ = ["DataLoader"]
