"""Elastic resume with real processes: a state taken at W ranks resumes at W' ranks, B' batch, N' workers.

Every phase runs each rank in its own spawned process (rank and world size given to the loader
as under torchrun). The run is ``shuffle=True`` over local shards (the global order) on the
default CPU backend (threads), whose augmentation is drawn per sample: the pixels of a sample
are the same whatever the world size.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, SMALL_SPEC, rank_report, spawn_ranks

pytestmark = pytest.mark.slow  # spawns of processes that import torch and DALI


def _phase(rank: int, world: int, batch: int, workers: int, stop: int | None, state: dict[str, Any] | None,
           shards: list[str], out: str) -> None:
    """One rank: iterate (stopping after ``stop`` steps, or to the epoch's end), record keys and pixel hashes."""
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    rank_report(out, rank, lambda: _record(rank, world, batch, workers, stop, state, shards))


def _record(rank: int, world: int, batch: int, workers: int, stop: int | None, state: dict[str, Any] | None,
            shards: list[str]) -> dict[str, Any]:
    """The rank's steps (valid keys and pixel hashes), the state where it stopped, the loader's length."""
    import feedfast

    loader = feedfast.DataLoader(SMALL_SPEC, shards=shards, batch_size=batch, shuffle=True, rank=rank,
                                 world_size=world, num_workers=workers, sample_info=True)
    if state is not None:
        loader.load_state_dict(state)
    steps, taken = [], None
    for images, _, info in loader:
        valid = info.valid.tolist()
        steps.append({"keys": [k for k, ok in zip(info.keys, valid) if ok],
                      "hashes": [hashlib.sha1(images[i].numpy().tobytes()).hexdigest()
                                 for i, ok in enumerate(valid) if ok]})
        if stop is not None and len(steps) == stop:
            taken = info.state
            break
    loader.close()
    return {"steps": steps, "state": taken, "len": len(loader)}


def _run(tmp: Path, shards: list[str], *, world: int, batch: int, workers: int = 2, stop: int | None = None,
         state: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One phase on ``world`` spawned ranks; each rank's record."""
    out = tmp / f"w{world}-b{batch}-n{workers}-s{stop}-{id(state)}"
    out.mkdir(exist_ok=True)
    return spawn_ranks(_phase, world, out, lambda r: (r, world, batch, workers, stop, state, shards, str(out)),
                       timeout_s=180)


def _sequence(records: list[dict[str, Any]]) -> list[str]:
    """The global sequence: step by step, rank by rank, the valid keys."""
    out: list[str] = []
    for s in range(max(len(r["steps"]) for r in records)):
        for r in records:
            if s < len(r["steps"]):
                out += r["steps"][s]["keys"]
    return out


def _pixels(records: list[dict[str, Any]]) -> dict[str, str]:
    return {k: h for r in records for step in r["steps"] for k, h in zip(step["keys"], step["hashes"])}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, shards: list[str]) -> dict[str, Any]:
    """The uninterrupted epoch at 1 rank, batch 4: its global sequence and every sample's pixels."""
    records = _run(tmp_path_factory.mktemp("ref"), shards, world=1, batch=4)
    return {"sequence": _sequence(records), "pixels": _pixels(records)}


@pytest.mark.parametrize(("before", "after"), [((2, 2), (3, 2)), ((3, 2), (2, 2)), ((1, 4), (2, 2))])
def test_a_state_resumes_at_another_world_size(tmp_path: Path, shards: list[str], reference: dict[str, Any],
                                              before: tuple[int, int], after: tuple[int, int]) -> None:
    (w, b), (w2, b2) = before, after
    first = _run(tmp_path, shards, world=w, batch=b, stop=2)
    states = [r["state"] for r in first]
    assert len({json.dumps({k: v for k, v in s.items() if k not in ("rank", "stats", "dali")}) for s in states}) == 1
    assert states[0]["consumed"] == 2 * w * b
    rest = _run(tmp_path, shards, world=w2, batch=b2, state=states[-1])  # any rank's state will do
    done, later = _sequence(first), _sequence(rest)
    assert sorted(done + later) == sorted(reference["sequence"])  # no sample lost or repeated
    assert len(set(done + later)) == 23
    if w * b == w2 * b2:  # the same global batch: the same global sequence as the uninterrupted run
        assert done + later == reference["sequence"]
    pixels = {**_pixels(first), **_pixels(rest)}
    assert pixels == reference["pixels"]  # augmentation drawn per sample: equal at any world size


def test_a_state_resumes_with_another_worker_count(tmp_path: Path, shards: list[str], reference: dict[str, Any]) -> None:
    first = _run(tmp_path, shards, world=1, batch=4, workers=2, stop=2)
    rest = _run(tmp_path, shards, world=1, batch=4, workers=4, state=first[0]["state"])
    assert _sequence(first) + _sequence(rest) == reference["sequence"]
    assert {**_pixels(first), **_pixels(rest)} == reference["pixels"]
