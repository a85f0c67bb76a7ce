"""Autotune: the loader picks its threads and batches ahead by the step time of the loop it feeds.

The objective is the training loop's own period, measured on the loop's thread between two
``next()`` calls: what a user would time. Loader throughput alone would mislead: threads that
make batches faster can slow a step that needs the same cores.

How it searches, in the spirit of Plumber's operational analysis (Kuchnik et al., MLSys 2022):

1. **Measure** the default configuration for a few batches. Per batch: the period ``T``, the
   time the loop spent in its own step ``C`` and waiting for data ``W`` (``T = C + W``), the
   time the loop's thread waited for a free core ``R`` (Linux's run-queue delay,
   ``/proc/thread-self/schedstat``), the loader's CPU ``D`` (its pool's threads count the CPU
   time of their jobs; where a backend has no such pool, the process's CPU less the loop
   thread's) and the step's CPU ``S`` (the loop thread's, plus the rest of the process beside
   the loader: torch's math threads).
2. **Model** each configuration's period from those figures (:class:`CostModel`): the loader
   makes a batch every ``L(n) = D / min(n, K - u)`` seconds with ``n`` threads on ``K`` cores
   of which the step takes ``u = S / T`` (calibrated on the measured period where the loop
   waited), and the loop's step stretches by its run-queue wait, which shrinks in
   proportion as fewer threads compete for the cores: ``C(n) = C - R + R * min(n, K) /
   min(n0, K)``. Predicted ``T(n) = max(C(n), L(n))``. Where the loop waited but the loader's
   CPU does not explain the wait (``L(n0)`` under 0.6 of the period), the waits come from
   jitter or read latency, and more batches ahead are predicted to absorb them. Where the loader
   sets the pace (the loop waited half its period or more) yet its threads kept under 0.8 of the
   cores they could use busy (``D / T``: they stall on the GIL or on reads), each thread is taken
   to add ``D / (T * n0)`` of a core, up to ``K - u``: ``L(n) = D / min(n * D / (T * n0), K - u)``,
   so more threads than cores are predicted to help (on 2 cores, 3 threads beat 2 with no step).
3. **Try** the configuration the model ranks best, if it predicts a gain of at least 3 %;
   keep it only if its measured period beats the best so far by 3 % and by half the spread of
   either's measured periods (a shared machine's noise must not pick it); re-fit the model and try
   the next while the budget (a share of the first epoch) lasts. Then settle on the best.

Every change is live (:mod:`feedfast.loader.knobs`): nothing restarts and no batch is made
twice, and the data do not change (each sample's augmentation comes from seed, epoch and
position). :meth:`Tuner.report` returns every trial, the model's figures and the reason for the
decision; ``DataLoader.tuning()`` returns it.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from feedfast.loader.knobs import Knobs

MARGIN = 0.03  # a candidate must be predicted, then measured, this much faster than the best so far
BUSY = 0.8  # a loader that sets the pace yet keeps less than this share of its cores busy is thread-limited
SETTLE = 1  # batches after a change before measuring (the queue still holds the old configuration's)
MEASURE = 3  # batches measured per trial (the median counts)
MIN_BUDGET = 1 + MEASURE + SETTLE + MEASURE  # batches: the default's trial and one candidate's
_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _runqueue_s() -> float:
    """Seconds this thread has waited on a run queue for a core (0 where Linux does not say)."""
    try:
        return int(_SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass(frozen=True)
class Mark:
    """Clocks read on the loop's thread at one point (``loader_cpu``: the pool's count, None where uncounted)."""

    wall: float
    thread_cpu: float
    process_cpu: float
    runqueue: float
    loader_cpu: float | None = None
    made: int = 0

    @staticmethod
    def now(knobs: Knobs | None = None) -> "Mark":
        if knobs is not None and knobs.counted:
            return Mark(time.perf_counter(), time.thread_time(), time.process_time(), _runqueue_s(), knobs.cpu,
                        knobs.made)
        return Mark(time.perf_counter(), time.thread_time(), time.process_time(), _runqueue_s())


@dataclass(frozen=True)
class Observation:
    """One batch of the loop, in seconds: its period, step, wait, the loop thread's CPU and run-queue wait,
    the process's CPU over the period, and the loader threads' per batch they finished (None where not
    counted: while the loader fills its queue it makes more than one batch a period)."""

    period: float
    step: float
    wait: float
    loop_cpu: float
    runqueue: float
    process_cpu: float
    loader_cpu: float | None = None
    made: int = 1

    @staticmethod
    def between(handed: Mark, asked: Mark, got: Mark) -> "Observation":
        """The batch asked for at ``asked`` and handed over at ``got``, the previous one handed at ``handed``."""
        loader = None if got.loader_cpu is None or handed.loader_cpu is None else \
            max(0.0, got.loader_cpu - handed.loader_cpu)
        return Observation(period=got.wall - handed.wall, step=asked.wall - handed.wall, wait=got.wall - asked.wall,
                           loop_cpu=asked.thread_cpu - handed.thread_cpu, runqueue=asked.runqueue - handed.runqueue,
                           process_cpu=got.process_cpu - handed.process_cpu, loader_cpu=loader,
                           made=max(1, got.made - handed.made))

    @property
    def loader(self) -> float:
        """The loader's CPU per batch: its threads' count over the batches they finished, else the process's CPU
        less the loop thread's."""
        if self.loader_cpu is not None:
            return self.loader_cpu / self.made
        return max(0.0, self.process_cpu - self.loop_cpu)

    @property
    def step_cpu(self) -> float:
        """The step's CPU: the loop thread's, and where the loader's threads count their own, the rest of the
        process's beside theirs (the step's math threads)."""
        if self.loader_cpu is None:
            return self.loop_cpu
        return self.loop_cpu + max(0.0, self.process_cpu - self.loop_cpu - self.loader_cpu)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


@dataclass(frozen=True)
class Figures:
    """Median figures of one configuration's measured batches (seconds per batch)."""

    period: float
    step: float
    wait: float
    step_cpu: float
    runqueue: float
    loader_cpu: float

    @staticmethod
    def of(obs: list[Observation]) -> "Figures":
        return Figures(period=_median([o.period for o in obs]), step=_median([o.step for o in obs]),
                       wait=_median([o.wait for o in obs]), step_cpu=_median([o.step_cpu for o in obs]),
                       runqueue=_median([o.runqueue for o in obs]), loader_cpu=_median([o.loader for o in obs]))


@dataclass(frozen=True)
class CostModel:
    """Predicted period of a configuration from one measured configuration's figures (see the module doc)."""

    base: Knobs
    figures: Figures
    cores: int

    def _capacity(self, threads: int) -> float:
        share = self.figures.step_cpu / self.figures.period if self.figures.period > 0 else 0.0
        return max(0.5, min(float(threads), self.cores - share))

    @property
    def loader_bound(self) -> bool:
        """Whether the loop waited for data (5 % of its period or more)."""
        return self.figures.wait >= 0.05 * self.figures.period

    @property
    def cpu_bound(self) -> bool:
        """Whether the loop waited and the loader's CPU explains its period (else: waits from jitter or latency)."""
        f = self.figures
        return self.loader_bound and f.loader_cpu / self._capacity(self.base.threads) >= 0.6 * f.period

    @property
    def busy(self) -> float:
        """Cores the loader's threads kept busy over the measured period."""
        return self.figures.loader_cpu / self.figures.period if self.figures.period > 0 else 0.0

    @property
    def thread_limited(self) -> bool:
        """Whether the loader sets the loop's pace (the loop waited half its period or more) while its threads
        kept under :data:`BUSY` of the cores they could use busy: they stall (on the GIL, on reads), so more
        threads than cores still add throughput, up to the cores."""
        f = self.figures
        return f.wait >= 0.5 * f.period and self.busy < BUSY * self._capacity(self.base.threads)

    def loader_period(self, threads: int) -> float:
        """Seconds the loader takes per batch with ``threads``."""
        f = self.figures
        if self.thread_limited:  # each thread keeps busy/n0 of a core busy, up to the cores free of the step
            per_thread = self.busy / max(1, self.base.threads)
            return f.loader_cpu / max(1e-9, min(threads * per_thread, self._capacity(self.cores)))
        if self.cpu_bound:  # calibrated: the measured period is the loader's at the base thread count
            return f.period * self._capacity(self.base.threads) / self._capacity(threads)
        return f.loader_cpu / self._capacity(threads)

    def step(self, threads: int) -> float:
        """Seconds of the loop's own step with ``threads`` competing for cores."""
        f = self.figures
        ratio = min(threads, self.cores) / max(1, min(self.base.threads, self.cores))
        return max(0.0, f.step - f.runqueue + f.runqueue * ratio)

    def predict(self, threads: int, prefetch: int) -> float:
        """The loop's predicted period (seconds per batch)."""
        period = max(self.step(threads), self.loader_period(threads))
        if self.cpu_bound or self.thread_limited:  # a deeper queue does not speed a loader that sets the pace
            return period
        # waits the loader's CPU does not explain (jitter, read latency) stay; a deeper queue absorbs them
        return period + self.figures.wait * min(1.0, self.base.prefetch / prefetch)


@dataclass
class Trial:
    """One configuration tried: its settings, what the model predicted and what was measured."""

    threads: int
    prefetch: int
    predicted_ms: float | None = None
    observations: list[Observation] = field(default_factory=list)

    @property
    def figures(self) -> Figures:
        return Figures.of(self.observations)

    @property
    def spread(self) -> float:
        """The measured periods' range over their median (0 for fewer than two)."""
        periods = [o.period for o in self.observations]
        return (max(periods) - min(periods)) / _median(periods) if len(periods) > 1 and _median(periods) > 0 else 0.0

    def beats(self, other: "Trial") -> bool:
        """Whether this trial's median period is shorter than ``other``'s by the margin and by half of either's
        spread (noise on a shared machine must not pick a setting)."""
        needed = max(MARGIN, self.spread / 2, other.spread / 2)
        return bool(self.observations) and self.figures.period < other.figures.period * (1 - needed)

    def row(self) -> dict[str, Any]:
        f = self.figures
        return {"threads": self.threads, "prefetch": self.prefetch, "batches": len(self.observations),
                "predicted_ms": None if self.predicted_ms is None else round(self.predicted_ms, 2),
                "period_ms": round(f.period * 1e3, 2), "step_ms": round(f.step * 1e3, 2),
                "wait_ms": round(f.wait * 1e3, 2), "step_cpu_ms": round(f.step_cpu * 1e3, 2),
                "runqueue_ms": round(f.runqueue * 1e3, 2), "loader_cpu_ms": round(f.loader_cpu * 1e3, 2),
                "spread": round(self.spread, 3)}


class Tuner:
    """The search over live settings, fed one measured batch at a time by the loader.

    Args:
        knobs: the loader's live settings; the search changes them and leaves the best.
        cores: cores the process may use.
        budget: batches the search may take (from the first batch it sees).
        tunable: which settings may change (``threads`` up to ``knobs.max_threads``, ``prefetch`` to twice
            its first value); the rest stay.
    """

    def __init__(self, knobs: Knobs, *, cores: int, budget: int,
                 tunable: tuple[str, ...] = ("threads", "prefetch")) -> None:
        self.knobs, self.cores, self.budget, self.tunable = knobs, cores, max(MIN_BUDGET, budget), tunable
        self.trials: list[Trial] = [Trial(knobs.threads, knobs.prefetch)]
        self.best = self.trials[0]
        self.model: CostModel | None = None
        self.seen = 0  # batches fed since the search began
        self.settle = 0  # the first batch is never measured (no step before it); the default's trial starts next
        self.done = False
        self.reason = ""
        self._handed: Mark | None = None

    # -- the loader's hooks: around each next() on the loop's thread ------------------------------------

    def asked(self) -> Mark:
        """Called when the loop asks for a batch; returns the mark to pass to :meth:`got`."""
        return Mark.now(self.knobs)

    def got(self, asked: Mark, fresh: bool = False) -> None:
        """Called when the batch asked for at ``asked`` is handed over; ``fresh``: the first of an iteration
        (its step spans the loop's work between epochs and is not measured)."""
        now = Mark.now(self.knobs)
        handed, self._handed = self._handed, now
        self.feed(None if handed is None or fresh else Observation.between(handed, asked, now))

    def feed(self, obs: Observation | None) -> None:
        """Count one batch handed to the loop, with its measurement (None: not measurable)."""
        if self.done:
            return
        self.seen += 1
        if obs is not None:
            if self.settle > 0:
                self.settle -= 1
            else:
                trial = self.trials[-1]
                trial.observations.append(obs)
                if len(trial.observations) >= MEASURE:
                    self._next_trial()
        if not self.done and self.seen >= self.budget:
            self._finish("the budget ran out")

    def pin(self, threads: int, prefetch: int, reason: str) -> None:
        """End the search with these settings (a resumed run keeps its tuned settings), even beyond its bounds."""
        self.knobs.max_threads = max(self.knobs.max_threads, threads)
        self.knobs.max_prefetch = max(self.knobs.max_prefetch, prefetch)
        self.knobs.set(threads=threads, prefetch=prefetch)
        self.trials = [Trial(self.knobs.threads, self.knobs.prefetch)]
        self.best = self.trials[0]
        self.done, self.reason = True, reason

    # -- the search -------------------------------------------------------------------------------------

    def _grid(self) -> list[tuple[int, int]]:
        """Every setting the search may choose: (threads, prefetch)."""
        first = self.trials[0]
        threads = range(1, self.knobs.max_threads + 1) if "threads" in self.tunable else [first.threads]
        prefetch = [first.prefetch, first.prefetch * 2] if "prefetch" in self.tunable else [first.prefetch]
        return [(n, p) for n in threads for p in prefetch if p <= self.knobs.max_prefetch]

    def _candidates(self) -> list[tuple[int, int]]:
        tried = {(t.threads, t.prefetch) for t in self.trials}
        return [c for c in self._grid() if c not in tried]

    def _keep_best(self) -> None:
        """The last trial becomes the best where it beats it."""
        last = self.trials[-1]
        if last is not self.best and last.beats(self.best):
            self.best = last

    def _next_trial(self) -> None:
        self._keep_best()
        self.model = CostModel(Knobs(self.best.threads, self.best.prefetch), self.best.figures, self.cores)
        best_period = self.best.figures.period
        ranked = sorted((self.model.predict(n, p), n, p) for n, p in self._candidates())
        if not ranked:
            self._finish("every candidate was tried")
            return
        predicted, n, p = ranked[0]
        if predicted > best_period * (1 - MARGIN):
            self._finish(f"no other setting is predicted {MARGIN:.0%} faster than {best_period * 1e3:.1f} ms "
                         f"(best predicted: threads={n}, prefetch={p} at {predicted * 1e3:.1f} ms)")
            return
        if self.seen + SETTLE + MEASURE > self.budget:
            self._finish(f"no budget left to try threads={n}, prefetch={p} "
                         f"(predicted {predicted * 1e3:.1f} ms)")
            return
        self.trials.append(Trial(n, p, predicted_ms=predicted * 1e3))
        self.settle = SETTLE
        self.knobs.set(threads=n, prefetch=p)

    def _finish(self, why: str) -> None:
        self._keep_best()
        self.knobs.set(threads=self.best.threads, prefetch=self.best.prefetch)
        kept = "kept" if self.best is self.trials[0] else "chosen"
        self.reason = f"threads={self.best.threads}, prefetch={self.best.prefetch} {kept}: {why}"
        self.done = True

    def report(self) -> dict[str, Any]:
        """The trials, the model's figures, the decision and its reason."""
        model = None
        if self.model is not None:
            m = self.model
            figures_ms = {k: round(v * 1e3, 2) for k, v in asdict(m.figures).items()}
            predicted = {f"threads={n},prefetch={p}": round(m.predict(n, p) * 1e3, 2) for n, p in self._grid()}
            model = {"cores": m.cores, "fitted_on": m.base.as_dict(), "loader_bound": m.loader_bound,
                     "cpu_bound": m.cpu_bound,
                     "thread_limited": m.thread_limited, "busy_cores": round(m.busy, 2), **figures_ms, "predicted_ms": predicted}
        return {"state": "done" if self.done else "searching", "budget_batches": self.budget,
                "batches_seen": self.seen, "tunable": list(self.tunable),
                "trials": [t.row() for t in self.trials if t.observations or t is self.trials[0]],
                "model": model, "decision": {"threads": self.best.threads, "prefetch": self.best.prefetch},
                "reason": self.reason}


def budget_batches(share: float, steps: int) -> int:
    """Batches of an epoch of ``steps`` the search may take: ``share`` of it, at least :data:`MIN_BUDGET`."""
    return max(MIN_BUDGET, math.ceil(share * steps))
