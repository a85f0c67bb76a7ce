"""Known device work per step for ``gpu_check.py``: calibrated CUDA matmuls, or the simulated GPU."""

from __future__ import annotations

import statistics
from typing import Any, Protocol

import torch
from gpucheck_common import Context


class Work(Protocol):
    """Known device work per step: ``launch`` enqueues about ``ms`` milliseconds and returns."""

    ms: float
    label: str

    def launch(self) -> None:
        """Enqueue the work without waiting for it."""

    def synchronize(self) -> None:
        """Wait until all enqueued work has finished."""

    def took_ms(self) -> float:
        """Mean device milliseconds of the launches since the last call (after ``synchronize``)."""


class MatmulWork:
    """``reps`` bf16 matmuls of ``n x n`` on CUDA, calibrated to about ``target_ms`` with CUDA events."""

    def __init__(self, target_ms: float, n: int = 8192) -> None:
        dev = torch.device("cuda")
        self.a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        self.out = torch.empty_like(self.a)
        self.time_ms(5)  # cuBLAS set-up and clocks
        per = self.time_ms(10) / 10
        self.reps = max(1, round(target_ms / per))
        self.ms = statistics.median(self.time_ms(self.reps) for _ in range(5))
        self.label = f"{self.reps} x {n}^2 bf16 matmul, timed with CUDA events"
        self._timed: list[tuple[Any, Any]] = []

    def _run(self, reps: int) -> None:
        for _ in range(reps):
            torch.mm(self.a, self.b, out=self.out)

    def time_ms(self, reps: int) -> float:
        """Milliseconds ``reps`` matmuls take on the GPU."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._run(reps)
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def launch(self) -> None:
        """Enqueue one step's matmuls between two timing events."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._run(self.reps)
        end.record()
        self._timed.append((start, end))

    def synchronize(self) -> None:
        """Wait for the GPU."""
        torch.cuda.synchronize()

    def took_ms(self) -> float:
        """Mean GPU milliseconds of the launches since the last call (events of each launch)."""
        times = [float(start.elapsed_time(end)) for start, end in self._timed]
        self._timed.clear()
        return statistics.fmean(times) if times else self.ms


class SimulatedWork:
    """The meter's clock-backed GPU stand-in (``SimulatedGpu``) running ``ms`` per launch."""

    def __init__(self, ms: float) -> None:
        from feedfast.meter import SimulatedGpu

        self.gpu = SimulatedGpu()
        self.ms = ms
        self.label = "SimulatedGpu (clock-backed events, dry run)"

    def launch(self) -> None:
        """Queue ``ms`` of simulated work."""
        self.gpu.launch(self.ms / 1e3)

    def synchronize(self) -> None:
        """Sleep until the simulated work is done."""
        self.gpu.synchronize()

    def took_ms(self) -> float:
        """Exactly ``ms``: simulated work takes what it is told."""
        return self.ms


def make_work(ctx: Context, target_ms: float) -> Work:
    """Calibrated matmuls on CUDA, the simulated GPU otherwise."""
    return MatmulWork(target_ms) if ctx.cuda else SimulatedWork(target_ms)


def meter_for(work: Work, **kwargs: Any) -> Any:
    """A StallMeter on CUDA events for matmul work, on the simulated GPU's events otherwise."""
    from feedfast.meter import StallMeter

    if isinstance(work, SimulatedWork):
        return StallMeter(events=work.gpu, **kwargs)
    return StallMeter(device="cuda", **kwargs)
