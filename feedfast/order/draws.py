"""Per-sample random draws from a counter-based generator: keyed by (seed, epoch, sample), made per batch.

Augmentation ops draw from an object with ``random()``, ``uniform(a, b)`` and
``randint(a, b)`` (the part of :class:`random.Random` they use). Seeding a ``random.Random``
per sample from a string costs about 7 us; here a batch's draws are computed at once, in
NumPy, as ``u[i, j] = mix64(mix64(sample_i ^ key) + j * golden)`` scaled to [0, 1) (a
counter-based generator in the manner of Philox: the j-th draw of a sample is a pure function
of (seed, epoch, sample, j)), and each sample gets a :class:`SampleDraws` reading its row.
So a sample's crops and flips depend on nothing but (seed, epoch, its canonical number):
not on the rank, the world size, the workers or the backend (``threads`` and ``pil`` agree),
and a padded copy equals its original. A sample that needs more than :data:`DRAWS` draws
(a crop that retries many times) computes the rest one by one, from the same function.

>>> d = batch_draws(seed=0, epoch=0, samples=np.array([5, 5]))
>>> d[0].random() == d[1].random()
True
"""

from __future__ import annotations

import threading

import numpy as np

from feedfast.order.permute import key_for, mix64

DRAWS = 32
"""Draws computed ahead per sample (random_resized_crop takes 2 per attempt, flip 1 or 2)."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SCALE = 1.0 / (1 << 53)


def uniforms(key: int, samples: np.ndarray, first: int, count: int) -> np.ndarray:
    """Draws ``first .. first + count - 1`` of each sample, float64 in [0, 1): shape [samples, count]."""
    s = np.asarray(samples, dtype=np.int64).astype(np.uint64)[:, None]
    j = np.arange(first, first + count, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        x = mix64(mix64(s ^ np.uint64(key)) + (j + np.uint64(1)) * _GOLDEN)
    return (x >> np.uint64(11)).astype(np.float64) * _SCALE


class _Table:
    """A batch's first :data:`DRAWS` draws per sample, computed when a sample first draws (specs without
    random ops never pay for them)."""

    __slots__ = ("key", "samples", "_rows", "_lock")

    def __init__(self, key: int, samples: np.ndarray) -> None:
        self.key, self.samples = key, samples
        self._rows: list[list[float]] | None = None
        self._lock = threading.Lock()

    def row(self, i: int) -> list[float]:
        rows = self._rows
        if rows is None:
            with self._lock:  # the samples of a batch are drawn in several threads
                if self._rows is None:
                    self._rows = uniforms(self.key, self.samples, 0, DRAWS).tolist()
                rows = self._rows
        return rows[i]


class SampleDraws:
    """One sample's draws, read in order; a stand-in for the ``random.Random`` ops draw from."""

    __slots__ = ("_table", "_i", "_row", "_next")

    def __init__(self, table: _Table, i: int) -> None:
        self._table, self._i, self._next = table, i, 0
        self._row: list[float] | None = None

    def replay(self) -> SampleDraws:
        """The same draws from the first (a sample that starts over on another path)."""
        return SampleDraws(self._table, self._i)

    def stream(self, n: int) -> SampleDraws:
        """This sample's ``n``-th stream of draws: as counter-based as this one, independent of it.

        An op that runs where its place in the sample's sequence of draws is not known (a
        kernel after geometry planned in C) draws from its own stream, keyed by its step.
        """
        return _StreamDraws(_stream_key(self._table.key, n), int(self._table.samples[self._i]))

    def random(self) -> float:
        """The next draw, uniform in [0, 1)."""
        j = self._next
        self._next = j + 1
        if j < DRAWS:
            if self._row is None:
                self._row = self._table.row(self._i)
            return self._row[j]
        sample = self._table.samples[self._i: self._i + 1]
        return float(uniforms(self._table.key, sample, j, 1)[0, 0])

    def uniform(self, a: float, b: float) -> float:
        """Uniform in [a, b] (as ``random.Random.uniform``)."""
        return a + (b - a) * self.random()

    def randint(self, a: int, b: int) -> int:
        """An integer in [a, b], each equally likely."""
        return a + min(int(self.random() * (b - a + 1)), b - a)


_MASK = (1 << 64) - 1
_GOLDEN_INT = int(_GOLDEN)


def _mix64_int(z: int) -> int:
    """:func:`~feedfast.order.permute.mix64` on one Python int (wrapping at 64 bits)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _stream_key(key: int, n: int) -> int:
    return _mix64_int(key ^ (((n + 1) * _GOLDEN_INT) & _MASK))


class _StreamDraws(SampleDraws):
    """One sample's stream of draws (:meth:`SampleDraws.stream`), each computed when it is drawn, in
    Python: an op on its own stream takes a few draws, and a row of :data:`DRAWS` in NumPy for one
    sample cost more than they do (about 40 us a stream). The values are :func:`uniforms`'."""

    __slots__ = ("_key", "_sample", "_base")

    def __init__(self, key: int, sample: int) -> None:
        self._key, self._sample, self._next = key, sample, 0
        self._base = _mix64_int((sample & _MASK) ^ key)

    def replay(self) -> SampleDraws:
        return _StreamDraws(self._key, self._sample)

    def stream(self, n: int) -> SampleDraws:
        return _StreamDraws(_stream_key(self._key, n), self._sample)

    def random(self) -> float:
        j = self._next
        self._next = j + 1
        return float(_mix64_int((self._base + (j + 1) * _GOLDEN_INT) & _MASK) >> 11) * _SCALE


def draws_key(seed: int, epoch: int) -> int:
    """The generator's key for (seed, epoch)."""
    return key_for("feedfast-draws", seed, epoch)[0]


def batch_draws(*, seed: int, epoch: int, samples: np.ndarray) -> list[SampleDraws]:
    """The draws of a batch's samples (canonical numbers), one :class:`SampleDraws` each."""
    return keyed_draws(draws_key(seed, epoch), samples)


def keyed_draws(key: int, samples: np.ndarray) -> list[SampleDraws]:
    """:func:`batch_draws` under the key :func:`draws_key` gave."""
    table = _Table(key, np.asarray(samples, dtype=np.int64))
    return [SampleDraws(table, i) for i in range(len(table.samples))]


def batch_generator(*parts: object) -> np.random.Generator:
    """A NumPy generator for one batch's batch-level draws (mixup, cutmix), keyed by ``parts``.

    Philox, NumPy's counter-based generator, keyed by SHA-256 of ``("feedfast-batch", *parts)``:
    the loader passes (seed, epoch, rank, world, step), so a batch's draws depend on nothing but
    its place in the epoch (a resumed epoch mixes as the uninterrupted one did) and each rank draws its own.
    """
    k = key_for("feedfast-batch", *parts)
    return np.random.Generator(np.random.Philox(key=k[0] | (k[1] << 64)))
