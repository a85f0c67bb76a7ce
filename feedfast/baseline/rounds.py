"""Alternating rounds and the spread of their ratios: pure functions, tested with plain lists.

A comparison runs each loader once per round. The order alternates (A B, B A, A B, ...), so
that neither loader always runs first, on a cooler machine or a warmer page cache, and drift
over the run (thermal, other tenants) lands on both sides evenly. Each round gives one ratio
(A's samples/s over B's, measured minutes apart at most); the figure reported is the median
ratio with its spread, not a ratio of means.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from feedfast.meter.stats import percentile


def round_order(names: Sequence[str], rounds: int) -> list[tuple[str, ...]]:
    """The order in which ``names`` run in each round: as given in even rounds, reversed in odd ones.

    >>> round_order(["feedfast", "torch"], 3)
    [('feedfast', 'torch'), ('torch', 'feedfast'), ('feedfast', 'torch')]
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    forward = tuple(names)
    return [forward if k % 2 == 0 else forward[::-1] for k in range(rounds)]


@dataclass(frozen=True)
class RatioSpread:
    """Per-round ratios of two loaders' samples/s and their summary.

    Attributes:
        median: the median ratio.
        low: the smallest ratio.
        high: the largest ratio.
        q1: the first quartile (linear interpolation).
        q3: the third quartile.
        ratios: the ratio of each round, in round order.
    """

    median: float
    low: float
    high: float
    q1: float
    q3: float
    ratios: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {**asdict(self), "ratios": list(self.ratios)}

    def text(self) -> str:
        """``"1.52x (min 1.44, max 1.60; IQR 1.48-1.55; 5 rounds)"``."""
        return (f"{self.median:.2f}x (min {self.low:.2f}, max {self.high:.2f}; IQR {self.q1:.2f}-{self.q3:.2f}; "
                f"{len(self.ratios)} round{'s' if len(self.ratios) != 1 else ''})")


def ratio_spread(numerator: Sequence[float], denominator: Sequence[float]) -> RatioSpread:
    """The spread of ``numerator[k] / denominator[k]`` over rounds ``k``.

    Raises:
        ValueError: the sequences are empty, differ in length, or a denominator is not > 0.
    """
    if not numerator or len(numerator) != len(denominator):
        raise ValueError(f"need one pair per round, got {len(numerator)} and {len(denominator)} values")
    if min(denominator) <= 0:
        raise ValueError(f"a round's denominator is not > 0: {list(denominator)}")
    ratios = tuple(a / b for a, b in zip(numerator, denominator, strict=True))
    q1, q3 = percentile(ratios, 25), percentile(ratios, 75)
    assert q1 is not None and q3 is not None  # ratios is not empty
    return RatioSpread(median=statistics.median(ratios), low=min(ratios), high=max(ratios), q1=q1, q3=q3,
                       ratios=ratios)
