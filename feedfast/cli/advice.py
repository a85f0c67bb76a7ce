"""What to change so the loader keeps up: pure arithmetic on measured figures.

Used by ``feedfast bench --step-ms`` (threads needed) and ``feedfast analyze`` (ranked
recommendations). Nothing here measures or prints; every function is tested with numbers.

The model (DS-Analyzer's, made explicit): per batch, the consumer needs ``step`` seconds
and the loader ``fetch + prep`` seconds, where ``prep`` is the batch time with shards in
memory and ``fetch`` what cold shards add. The prefetch queue overlaps the two sides, so a
run's batch time is ``max(step, fetch + prep)`` and its stall fraction
``(batch - step) / batch``. A change that makes prep ``k`` times faster and fetch ``f``
times as long predicts ``max(step, fetch * f + prep / k)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from feedfast.meter import verdict

MODEL = ("per batch: time = max(step, fetch + prep), step = synthetic run's batch time, "
         "prep = cached run's batch time, fetch = cold minus cached batch time (>= 0; or, when the "
         "shuffle buffer took every sample before timing, cold minus cached time to first batch over an "
         "epoch's batches); a change that "
         "speeds prep up k times and scales fetch by f predicts max(step, fetch*f + prep/k); "
         "threads scale prep linearly up to the core count; decode cost scales with decoded pixels; "
         "JPEG bytes scale with pixels")
"""The model behind every predicted gain, as printed with the recommendations."""


def threads_needed(threads: int, required: float, achieved: float) -> int:
    """Threads for ``required`` samples/s when ``threads`` give ``achieved``, assuming linear scaling.

    >>> threads_needed(2, 600.0, 300.0)
    4
    """
    if achieved <= 0:
        raise ValueError(f"achieved rate must be > 0, got {achieved}")
    return max(threads, math.ceil(threads * required / achieved - 1e-9))


def step_recommendation(*, stall_fraction: float | None, threads: int, cores: int, required: float,
                        achieved: float, placement: str, cuda: bool) -> tuple[str, int | None]:
    """What removes the stall a simulated step measured, and the threads that needs.

    Returns:
        (the recommendation, the thread count needed by the linear model; None when no
        stall was measured).
    """
    if stall_fraction is None or verdict(stall_fraction) == "not input-bound" or achieved <= 0:
        return f"none needed: the loader keeps up ({achieved:.0f} samples/s delivered, {required:.0f} needed)", None
    need = threads_needed(threads, required, achieved)
    rate = f"{required:.0f} samples/s needed, {achieved:.0f} delivered with {threads} threads"
    if need <= cores:
        return f"raise --threads to {need} ({rate}; threads x required/achieved)", need
    more = f"{need} threads needed by the linear model but {cores} cores here ({rate})"
    if placement != "gpu" and cuda:
        return f"GPU decode (--device gpu): {more}", need
    if placement != "gpu":
        head = f"use all {cores} cores (--threads {cores}), then " if threads < cores else ""
        return (f"{head}GPU decode (device gpu, on a machine with a GPU) or fewer/smaller images "
                f"(re-encode to a shorter side): {more}"), need
    return f"fewer/smaller images (re-encode to a shorter side) or more cores for reading: {more}", need


@dataclass(frozen=True)
class Timings:
    """Seconds per batch of the three differential runs.

    Attributes:
        step: the synthetic run (the consumer alone: the compute ceiling).
        cached: shards in memory (prep only).
        cold: shards as given (fetch plus prep).
    """

    step: float
    cached: float
    cold: float

    @property
    def prep(self) -> float:
        """The loader's prep time per batch (an upper bound when the cached run did not stall)."""
        return self.cached

    @property
    def fetch(self) -> float:
        """What fetching adds per batch (never negative)."""
        return max(0.0, self.cold - self.cached)

    def stalls(self) -> dict[str, float]:
        """Prep and fetch stall per batch (ms) and as fractions of the cold run's batch time."""
        prep_ms = max(0.0, self.cached - self.step) * 1e3
        fetch_ms = self.fetch * 1e3
        base = max(self.cold, self.step) * 1e3
        return {"prep_stall_ms": prep_ms, "fetch_stall_ms": fetch_ms,
                "prep_stall_fraction": prep_ms / base if base else 0.0,
                "fetch_stall_fraction": fetch_ms / base if base else 0.0}

    def predict(self, *, prep_speedup: float = 1.0, fetch_scale: float = 1.0) -> tuple[float, float]:
        """(batch time, stall fraction) after a change, by the module's model."""
        loader = self.fetch * fetch_scale + self.prep / prep_speedup
        batch = max(self.step, loader)
        return batch, (batch - self.step) / batch if batch > 0 else 0.0

    def speedup(self, *, prep_speedup: float = 1.0, fetch_scale: float = 1.0) -> float:
        """How many times faster batches arrive after a change (1.0: no gain)."""
        now, _ = self.predict()
        after, _ = self.predict(prep_speedup=prep_speedup, fetch_scale=fetch_scale)
        return now / after if after > 0 else 1.0

    def loader_speedup(self, *, prep_speedup: float = 1.0, fetch_scale: float = 1.0) -> float:
        """How many times faster the loader alone gets (``fetch + prep``), the step's cap aside."""
        now = self.fetch + self.prep
        after = self.fetch * fetch_scale + self.prep / prep_speedup
        return now / after if after > 0 else 1.0


@dataclass(frozen=True)
class ReadWindow:
    """Which samples a run's reader fetched while it was timed.

    A shuffling reader fills its buffer before the first batch, then reads one sample per
    sample taken; so over the timed batches it reads only what the epoch has left after the
    buffer and the warm-up.

    Attributes:
        epoch_batches: batches per epoch on this rank.
        batch_size: samples per batch.
        shuffle_buffer: samples the reader holds (0: no shuffling).
        warmup: untimed batches before the timed ones.
        batches: timed batches.
    """

    epoch_batches: int
    batch_size: int
    shuffle_buffer: int
    warmup: int
    batches: int

    def timed_reads(self) -> int:
        """Samples read from the shards during the timed batches (first epoch)."""
        left = self.epoch_batches * self.batch_size - self.shuffle_buffer - self.warmup * self.batch_size
        return min(max(left, 0), self.batches * self.batch_size)

    def fetch(self, *, steady_s: float, startup_s: float) -> tuple[float, str]:
        """Fetch seconds per batch and how it was found.

        ``steady_s`` is the cold minus cached batch time; ``startup_s`` the cold minus
        cached time to first batch. When the timed batches read nothing (the buffer
        already held every sample left), the start-up difference spread over an epoch is
        the figure; a difference in batch times would be noise.
        """
        reads = self.timed_reads()
        if reads >= self.batches * self.batch_size:
            return max(0.0, steady_s), "steady state: cold minus cached batch time"
        if reads == 0:
            if startup_s > 0:
                found = f"{startup_s:.2f} s"
            else:  # timing noise: the cold run reached its first batch no later than the cached one
                found = f"none: the cold run's first batch came {-startup_s:.2f} s sooner"
            return max(0.0, startup_s) / max(self.epoch_batches, 1), (
                f"start-up: the shuffle buffer ({self.shuffle_buffer} samples) and warm-up took every sample of "
                f"the epoch before timing, so fetch is the cold minus cached time to first batch "
                f"({found}) spread over the epoch's {self.epoch_batches} batches")
        return max(0.0, steady_s), (f"partial: only {reads} of the {self.batches * self.batch_size} timed samples "
                                    "were read from the shards (the rest came from the shuffle buffer); fetch "
                                    "is understated: use a larger dataset or more --batches")


def decode_share(decode_ms: float, batch_size: int, threads: int, prep_s: float) -> float:
    """The share of prep time spent decoding, capped at 0.95.

    ``decode_ms`` is one image's full decode on one thread (PIL); the loader decodes a
    batch on ``threads`` threads. An overestimate when the plan decodes regions only.
    """
    if prep_s <= 0:
        return 0.0
    return min(0.95, decode_ms / 1e3 * batch_size / max(threads, 1) / prep_s)


def speedup_from_decode(share: float, kept: float) -> float:
    """Prep speed-up when decoding keeps ``kept`` of its cost (0: decoding gone)."""
    return 1.0 / max(1e-6, 1.0 - share * (1.0 - kept))
