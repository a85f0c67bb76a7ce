"""StallMeter: how long a training loop waits for its data."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from feedfast.errors import UserError
from feedfast.meter import dist, plot, report
from feedfast.meter.batch import BatchSize, check_batch_size, count_samples, unsized_message
from feedfast.meter.events import EventFactory, TimingEvent, basis_note, basis_of, gpu_index, resolve_events
from feedfast.meter.forms import WaitScope, fetch, metered
from feedfast.meter.samplers import SAMPLER_KEYS, Sampler
from feedfast.meter.settings import build_samplers, check_callback, check_int, check_rate
from feedfast.meter.stats import DEFAULT_WARMUP, MIN_STEPS
from feedfast.meter.steps import StepLog
from feedfast.meter.summary import callback_figures, run_figures

T = TypeVar("T")


class StallMeter:
    """Measures data wait per step: host wait, or GPU idle from CUDA events.

    A step is the data wait (time inside ``next()``) plus the compute after it (from the
    batch's arrival to the next request). Figures cover complete steps after the first
    ``warmup`` (10 by default), and a verdict needs ``min_steps`` of them (30 by default;
    before that the verdict is ``"too few steps"``); on the GPU basis a step is complete once its two events have completed
    (read lazily with ``query()``, never synchronizing; call ``torch.cuda.synchronize()``
    before ``summary()`` to include the last few). Use a meter from the training thread;
    it is not thread-safe (its samplers run in their own threads).

    Example::

        meter = StallMeter()
        for batch in meter.wrap(loader):
            train_step(batch)
        print(meter.table())

    Args:
        window: Steps in the rolling window (``summary()["window"]``).
        warmup: First steps left out of every figure (default 10, see
            :data:`~feedfast.meter.stats.DEFAULT_WARMUP`; 0 counts the loader's start-up).
        min_steps: Measured steps (after the warm-up) before a verdict is given (default
            30, see :data:`~feedfast.meter.stats.MIN_STEPS`); the rolling window's verdict
            needs this many or the whole window, whichever is fewer.
        batch_size: Samples per batch: None infers it (first dim of the first tensor),
            an int fixes it, a callable maps the batch to it.
        every: Call ``callback`` every this many steps (0: never).
        callback: Called with :func:`report.flatten` figures (run totals and window).
        device: ``"auto"`` (CUDA events if CUDA is available), ``"cpu"``, ``"cuda[:N]"``;
            ``auto`` and ``cuda`` are the rank's GPU by the loader's rule (``cuda:{LOCAL_RANK}``
            under torchrun, else the current device).
        events: An event factory overriding ``device`` (``CudaEvents``, ``SimulatedGpu``).
        samplers: True (CPU and NVML, NVML on the events' GPU), False, or a list of samplers.
        sample_hz: Samples per second of the default samplers.
        clock: The host clock in seconds.

    Raises:
        UserError: A setting is out of range; the message names it.
    """

    def __init__(
        self,
        *,
        window: int = 100,
        warmup: int = DEFAULT_WARMUP,
        min_steps: int = MIN_STEPS,
        batch_size: BatchSize = None,
        every: int = 0,
        callback: Callable[[dict[str, float]], Any] | None = None,
        device: str | None = "auto",
        events: EventFactory | None = None,
        samplers: bool | Sequence[Sampler] = True,
        sample_hz: float = 10.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._window = check_int("window", window, 1)
        self._every = check_int("every", every, 0)
        check_callback(self._every, callback)
        self._batch_size = check_batch_size(batch_size)
        self._callback = callback
        self._events = resolve_events(device, events)
        self._log = StepLog(gpu=self._events is not None, warmup=check_int("warmup", warmup, 0))
        self._min_steps = check_int("min_steps", min_steps, 1)
        self._samplers = build_samplers(samplers, check_rate("sample_hz", sample_hz), gpu_index(self._events))
        self._clock = clock
        self._running = False
        self._t_wait: float | None = None
        self._t_step = 0.0
        self._start_event: TimingEvent | None = None
        self._warned_unsized = False
        self._wait_count = 0

    @property
    def basis(self) -> str:
        """``"gpu-events"`` (GPU idle from events) or ``"host-wait"`` (time in ``next()``)."""
        return basis_of(self._events)

    @property
    def wait_count(self) -> int:
        """How many waits have begun (``wait_begin`` calls), ended or not."""
        return self._wait_count

    def start(self) -> StallMeter:
        """Start the background samplers (measuring starts them too). Returns self."""
        if not self._running:
            self._running = True
            for sampler in self._samplers:
                sampler.start()
        return self

    def stop(self) -> None:
        """Close the open step and stop the samplers; figures stay readable."""
        self.step_end()
        self._running = False
        for sampler in self._samplers:
            sampler.stop()

    def __enter__(self) -> StallMeter:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield ``iterable``'s batches, timing each wait and step.

        ``iter(iterable)`` counts in the first wait (a DataLoader starts its workers
        there). Leaving the loop early (``break``) closes the last step.
        """
        self.start()
        return metered(self, iterable)

    def fetch(self, iterator: Iterator[T]) -> T:
        """``next(iterator)``, timed as a data wait; StopIteration passes through untimed."""
        return fetch(self, iterator)

    def wait(self, *, batch_size: int | None = None) -> WaitScope:
        """A data wait as a ``with`` block; an exception inside drops the wait.

        Example::

            with meter.wait() as w:
                w.batch = batch = next(it)   # or meter.wait(batch_size=256)

        Raises:
            UserError: ``batch_size`` is not None or an int >= 0.
        """
        if batch_size is not None:
            check_int("wait(batch_size=...)", batch_size, 0)
        return WaitScope(self, batch_size)

    def wait_begin(self) -> None:
        """The loop asks for the next batch: closes the running step, starts a wait."""
        if not self._running:
            self.start()
        self.step_end()
        self._wait_count += 1
        self._t_wait = self._clock()
        if self._events is not None:
            self._start_event = self._events()
            self._start_event.record()

    def wait_end(self, batch: Any = None, *, batch_size: int | None = None) -> None:
        """The batch is in hand: ends the wait, starts the step's compute.

        Args:
            batch: The batch, to count its samples.
            batch_size: Its sample count, overriding the meter's ``batch_size``.

        Raises:
            UserError: No wait is open (call :meth:`wait_begin` first).
        """
        if self._t_wait is None:
            raise UserError(
                "StallMeter.wait_end() without wait_begin(); fix: call "
                "meter.wait_begin() before asking the loader for a batch"
            )
        pair = None
        if self._events is not None and self._start_event is not None:
            end = self._events()
            end.record()
            pair = (self._start_event, end)
        now = self._clock()
        if batch_size is not None:
            samples: int | None = check_int("wait_end(batch_size=...)", batch_size, 0)
        else:
            samples = count_samples(batch, self._batch_size)
        if samples is None:
            samples = -1
            if not self._warned_unsized:
                self._warned_unsized = True
                warnings.warn(unsized_message(batch), RuntimeWarning, stacklevel=2)
        self._log.add_wait(now - self._t_wait, samples, pair)
        self._t_wait = self._start_event = None
        if pair is not None:
            self._log.poll()
        self._t_step = self._clock()

    def wait_cancel(self) -> None:
        """Drop an open wait (the iterator ended or raised); a no-op when none is open."""
        self._t_wait = self._start_event = None

    def step_end(self) -> None:
        """Close the running step now; time until the next wait is left out (a no-op if none)."""
        if not self._log.open:
            return
        self._log.add_compute(self._clock() - self._t_step)
        if self._every and len(self._log.compute) % self._every == 0:
            self._fire()

    def _fire(self) -> None:
        assert self._callback is not None  # invariant: every > 0 implies a callback
        self._callback(callback_figures(self._log, self._window))

    def summary(self, *, all_ranks: bool = False) -> dict[str, Any]:
        """Return the figures so far.

        The keys of :func:`feedfast.meter.stats.figures` for the whole run, plus
        ``basis``, ``basis_note``, ``warmup_steps``, ``min_steps``, ``pending_events``,
        ``window`` (the same figures over the last ``window`` steps), the sampler figures
        (None when unavailable) and ``samplers`` (each sampler's status).

        Args:
            all_ranks: Gather every rank's figures; a collective under torch.distributed.
                Then the run figures at the top level are the job's, over all ranks
                (:func:`feedfast.meter.dist.aggregate`: the worst rank's stall, summed
                rates, described under ``aggregate``, with ``stall_fraction_mean``), beside
                ``ranks`` (each rank's figures, this one's included), ``straggler`` and
                ``world_size``; ``window`` and the sampler figures stay this rank's.
        """
        out = run_figures(self._log, self._window, self._min_steps)
        out.update(basis=self.basis, basis_note=basis_note(self._events))
        out.update(dict.fromkeys(SAMPLER_KEYS))
        for sampler in self._samplers:
            out.update(sampler.figures())
        out["samplers"] = {s.name: s.status() for s in self._samplers}
        if all_ranks:
            gathered = dist.gather_figures(out)
            out.update(gathered.pop("job"))
            out.update(gathered)
        return out

    def gather(self) -> dict[str, Any]:
        """Every rank's figures, their aggregate (``job``) and the straggler; see :func:`dist.gather_figures`."""
        return dist.gather_figures(self.summary())

    def table(self, *, all_ranks: bool = False) -> str:
        """The summary as a printable table (with ``all_ranks``, the job's; a collective then)."""
        return report.table(self.summary(all_ranks=all_ranks))

    def to_json(self, path: str | Path | None = None) -> str:
        """The summary as JSON, also written to ``path`` when given."""
        return report.to_json(self.summary(), path)

    def plot(self, path: str | Path) -> Path:
        """Write a PNG of wait and step time per step; needs matplotlib."""
        self._log.poll()
        waits, hosts, steps = self._log.series()
        return plot.plot_series(path, waits=waits, host_waits=hosts, steps=steps, basis=self.basis)
