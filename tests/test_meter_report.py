"""Reports of StallMeter: dict, JSON, table, flat dict, PNG plot."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from feedfast.errors import UserError
from feedfast.meter import ManualClock, StallMeter, flatten


def measured_meter(steps: int = 12, **settings: Any) -> StallMeter:
    """Steps waiting 0, 2, 4 ms in turn, each computing 10 ms; every step counts unless ``settings`` say otherwise."""
    clock = ManualClock()
    settings = {"warmup": 0, "min_steps": 1, **settings}
    meter = StallMeter(samplers=False, device="cpu", clock=clock, window=5, **settings)

    def loader() -> Iterator[torch.Tensor]:
        for i in range(steps):
            clock.advance(0.002 * (i % 3))
            yield torch.zeros(4, 2)

    for _batch in meter.wrap(loader()):
        clock.advance(0.010)
    return meter


REQUIRED_KEYS = {
    "steps",
    "samples",
    "wall_s",
    "stall_fraction",
    "wait_p50_ms",
    "wait_p95_ms",
    "wait_max_ms",
    "samples_per_s",
    "basis",
    "verdict",
    "required_samples_per_s",
    "window",
    "cpu_util",
    "gpu_util",
}


def test_summary_has_the_documented_keys() -> None:
    summary = measured_meter().summary()
    assert set(summary) >= REQUIRED_KEYS
    assert summary["cpu_util"] is None and summary["gpu_util"] is None and summary["samplers"] == {}


def test_to_json_round_trips_and_writes(tmp_path: Path) -> None:
    meter = measured_meter()
    path = tmp_path / "meter.json"
    text = meter.to_json(path)
    loaded = json.loads(path.read_text())
    assert json.loads(text) == loaded
    assert loaded["steps"] == 12 and loaded["window"]["steps"] == 5
    assert loaded["stall_fraction"] == pytest.approx(meter.summary()["stall_fraction"])


def test_table_shows_run_window_and_verdict() -> None:
    text = measured_meter().table()
    assert "host-wait" in text and "last 5 steps" in text
    assert "moderately input-bound" in text or "highly input-bound" in text
    assert "unavailable" in text


def test_flatten_keeps_numbers_only() -> None:
    flat = flatten(
        {
            "a": 1,
            "b": "x",
            "c": None,
            "d": {"e": 2.5, "f": True},
            "g": [1.0, None],
            "h": float("nan"),
        },
        prefix="data/",
    )
    assert flat == {"data/a": 1, "data/d/e": 2.5, "data/g/0": 1.0}


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = measured_meter().plot(tmp_path / "meter.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UserError, match="pip install matplotlib"):
        measured_meter().plot(tmp_path / "meter.png")
