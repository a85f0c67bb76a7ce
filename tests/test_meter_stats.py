"""Pure parts of the meter: verdict, percentiles, figures, batch size inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from feedfast.errors import UserError
from feedfast.meter import infer_batch_size, verdict
from feedfast.meter.batch import count_samples
from feedfast.meter.stats import Totals, figures, percentile


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [
        (None, "no steps measured"),
        (0.0, "not input-bound"),
        (0.0499, "not input-bound"),
        (0.05, "moderately input-bound"),
        (0.1999, "moderately input-bound"),
        (0.20, "highly input-bound"),
        (0.9, "highly input-bound"),
    ],
)
def test_verdict_thresholds(fraction: float | None, expected: str) -> None:
    assert verdict(fraction) == expected


@given(
    st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=50),
    st.sampled_from([0, 50, 95, 100]),
)
def test_percentile_matches_numpy(values: list[float], q: int) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-9)


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None


def test_figures_of_no_steps() -> None:
    out = figures(Totals(), [], [])
    assert out["steps"] == 0 and out["stall_fraction"] is None
    assert out["wait_max_ms"] is None and out["verdict"] == "no steps measured"


def test_figures_leave_unsized_steps_out_of_rates() -> None:
    totals = Totals()
    totals.add(0.010, 0.010, 0.020, 10)  # sized: 10 samples, 10 ms compute
    totals.add(0.010, 0.010, 0.020, -1)  # unknown size: time only
    out = figures(totals)
    assert out["steps"] == 2 and out["unsized_steps"] == 1 and out["samples"] == 10
    assert out["stall_fraction"] == pytest.approx(0.5)
    assert out["samples_per_s"] == pytest.approx(10 / 0.020)
    assert out["required_samples_per_s"] == pytest.approx(10 / 0.010)
    assert out["wait_p50_ms"] is None


@pytest.mark.parametrize(
    ("batch", "size"),
    [
        (torch.zeros(32, 3, 4, 4), 32),
        ((torch.zeros(32, 3), torch.zeros(32)), 32),
        ({"image": torch.zeros(8, 2), "label": torch.zeros(8)}, 8),
        ([{"jpg": torch.zeros(4, 2)}], 4),
        ([["text", torch.zeros(6)]], 6),
        (np.zeros((5, 2)), 5),
        (torch.tensor(3.0), None),
        ("text", None),
        ([1, 2, 3], None),
        ({}, None),
    ],
)
def test_infer_batch_size(batch: object, size: int | None) -> None:
    assert infer_batch_size(batch) == size


def test_count_samples_checks_the_callable() -> None:
    assert count_samples(torch.zeros(3), 7) == 7
    assert count_samples({"n": 2}, lambda b: b["n"]) == 2
    with pytest.raises(UserError, match="returned"):
        count_samples(torch.zeros(3), lambda b: "three")  # type: ignore[arg-type,return-value]
