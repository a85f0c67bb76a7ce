"""Shared fixtures: small real JPEG shards written by the tests themselves."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SMALL_SPEC, make_shards, unindexed_shards
from tests.rangeserver import RangeServer


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDFAST_CACHE", str(tmp_path_factory.getbasetemp() / "ffcache"))


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """23 small photo-like JPEG samples in 5 shards (5, 5, 5, 5, 3), labels 0..9."""
    return make_shards(tmp_path_factory.mktemp("shards"), samples=23, per_shard=5)


@pytest.fixture()
def small_spec() -> dict:
    """imagenet-train shrunk to 32 px crops, batch 4."""
    import copy

    return copy.deepcopy(SMALL_SPEC)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


os.environ.setdefault("DALI_DISABLE_NVML", "1")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """23 samples in 5 shards (5, 5, 5, 5, 3), with no index files beside them (feedfast scans them once); one
    folder a test module."""
    return unindexed_shards(tmp_path_factory.mktemp("unindexed-shards"))


@pytest.fixture()
def server(local: list[str]) -> Iterator[RangeServer]:
    """A loopback ranged http server over ``local``'s folder."""
    with RangeServer(Path(local[0]).parent) as srv:
        yield srv
