"""Per-sample draws from a counter-based generator: a pure function of (seed, epoch, sample, draw)."""

from __future__ import annotations

import numpy as np

from feedfast.loader.draws import DRAWS, batch_draws, draws_key, uniforms


def test_a_samples_draws_depend_on_seed_epoch_and_sample_only() -> None:
    a = batch_draws(seed=1, epoch=2, samples=np.array([10, 11, 10]))
    first = [d.random() for d in a]
    assert first[0] == first[2] != first[1]
    again = batch_draws(seed=1, epoch=2, samples=np.array([11]))[0]
    assert again.random() == first[1]
    assert batch_draws(seed=1, epoch=3, samples=np.array([10]))[0].random() != first[0]
    assert batch_draws(seed=2, epoch=2, samples=np.array([10]))[0].random() != first[0]


def test_draws_past_the_precomputed_ones_continue_the_same_stream() -> None:
    d = batch_draws(seed=0, epoch=0, samples=np.array([42]))[0]
    values = [d.random() for _ in range(DRAWS + 5)]
    direct = uniforms(draws_key(0, 0), np.array([42]), 0, DRAWS + 5)[0].tolist()
    assert values == direct
    replay = d.replay()
    assert [replay.random() for _ in range(3)] == values[:3]


def test_uniform_and_randint_cover_their_ranges_evenly() -> None:
    draws = batch_draws(seed=5, epoch=0, samples=np.arange(20_000))
    ints = np.array([d.randint(3, 7) for d in draws])
    assert set(ints.tolist()) == {3, 4, 5, 6, 7}
    counts = np.bincount(ints - 3) / len(ints)
    assert np.all(np.abs(counts - 0.2) < 0.02)
    u = np.array([d.uniform(-2.0, 2.0) for d in draws])
    assert -2.0 <= u.min() and u.max() <= 2.0 and abs(u.mean()) < 0.05
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.05
