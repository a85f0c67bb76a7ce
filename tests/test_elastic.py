"""Elastic resume with real processes: a state taken at W ranks resumes at W' ranks, B' batch, N' workers.

Every phase runs each rank in its own spawned process (rank and world size given to the loader
as under torchrun). The run is ``shuffle=True`` over local shards (the global order) on the
default CPU backend (threads), whose augmentation is drawn per sample: the pixels of a sample
are the same whatever the world size.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import SMALL_SPEC

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # spawns of processes that import torch and DALI


def _phase(config_path: str) -> None:
    """One rank: iterate (stopping after ``stop`` steps, or to the epoch's end), record keys and pixel hashes."""
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    config = json.loads(Path(config_path).read_text())
    try:
        import feedfast

        loader = feedfast.DataLoader(SMALL_SPEC, shards=config["shards"], batch_size=config["batch"], shuffle=True,
                                     rank=config["rank"], world_size=config["world"], num_workers=config["workers"],
                                     sample_info=True)
        if config["state"] is not None:
            loader.load_state_dict(config["state"])
        steps, state = [], None
        for images, _, info in loader:
            valid = info.valid.tolist()
            steps.append({"keys": [k for k, ok in zip(info.keys, valid) if ok],
                          "hashes": [hashlib.sha1(images[i].numpy().tobytes()).hexdigest()
                                     for i, ok in enumerate(valid) if ok]})
            if config["stop"] is not None and len(steps) == config["stop"]:
                state = info.state
                break
        loader.close()
        Path(config["out"]).write_text(json.dumps({"steps": steps, "state": state, "len": len(loader)}))
    except BaseException:  # noqa: BLE001 - reported to the parent through the file
        Path(config["out"]).write_text(json.dumps({"error": traceback.format_exc()}))


def _run(tmp: Path, shards: list[str], *, world: int, batch: int, workers: int = 2, stop: int | None = None,
         state: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One phase on ``world`` spawned ranks; each rank's record."""
    ctx = mp.get_context("spawn")
    procs, outs = [], []
    for rank in range(world):
        out = tmp / f"w{world}-b{batch}-n{workers}-s{stop}-{id(state)}-r{rank}.json"
        config = tmp / (out.name + ".in")
        config.write_text(json.dumps({"shards": shards, "rank": rank, "world": world, "batch": batch,
                                      "workers": workers, "stop": stop, "state": state, "out": str(out)}))
        procs.append(ctx.Process(target=_phase, args=(str(config),)))
        outs.append(out)
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    for p, o in zip(procs, outs):
        assert o.exists(), f"rank process ended with exit code {p.exitcode} and wrote nothing"
    records = [json.loads(o.read_text()) for o in outs]
    for r in records:
        assert "error" not in r, r.get("error")
    return records


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
