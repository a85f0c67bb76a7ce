"""Per-sample draws from a counter-based generator: a pure function of (seed, epoch, sample, draw)."""

from __future__ import annotations

import numpy as np

from feedfast.order.draws import DRAWS, batch_draws, draws_key, uniforms


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


def _numpy_stream_key(key: int, n: int) -> int:
    from feedfast.order.permute import mix64

    with np.errstate(over="ignore"):
        return int(mix64(np.uint64(key) ^ (np.uint64(n + 1) * np.uint64(0x9E3779B97F4A7C15))))


def test_a_stream_s_draws_are_uniforms_of_its_key_drawn_one_by_one() -> None:
    """A stream (an op's own draws) gives what NumPy's uniforms give for the stream's key, for every
    draw (past DRAWS too), its replays and its own streams."""
    rng = np.random.default_rng(0)
    for sample in [0, 1, 42, 2**40 + 7, *rng.integers(0, 2**62, 20).tolist()]:
        for seed, n in ((0, 0), (3, 5), (7, 1000)):
            d = batch_draws(seed=seed, epoch=1, samples=np.array([sample, 3]))[0]
            key = _numpy_stream_key(draws_key(seed, 1), n)
            want = uniforms(key, np.array([sample]), 0, DRAWS + 4)[0].tolist()
            stream = d.stream(n)
            assert [stream.random() for _ in range(DRAWS + 4)] == want
            replay, nested = stream.replay(), stream.stream(2)
            assert [replay.random() for _ in range(3)] == want[:3]
            assert [nested.random() for _ in range(3)] == uniforms(_numpy_stream_key(key, 2), np.array([sample]), 0,
                                                                   3)[0].tolist()
