"""The stall meter: how long a training loop waits for data, on any loader.

``StallMeter`` wraps any iterable of batches (feedfast's loader, a torch DataLoader, a
generator) and reports the data wait per step, as GPU idle time from CUDA events when
CUDA is there and as host wait otherwise, with a verdict, rolling-window figures,
CPU/GPU samplers, and reports (dict, JSON, table, logger callback, PNG plot).

Modules: ``meter`` (StallMeter), ``events`` (CUDA events and the event protocol),
``clock`` (a clock-backed GPU stand-in), ``steps`` (per-step record), ``stats`` (pure
figures and verdict), ``batch`` (batch size inference), ``samplers``/``nvml``
(background samplers), ``report``/``plot`` (outputs), ``dist`` (per-rank gathering),
``overhead`` (the meter's own cost).
"""

from __future__ import annotations

from feedfast.meter.batch import infer_batch_size
from feedfast.meter.clock import ManualClock, SimulatedGpu
from feedfast.meter.events import CudaEvents, EventFactory, TimingEvent
from feedfast.meter.meter import StallMeter
from feedfast.meter.nvml import NvmlSampler
from feedfast.meter.overhead import measure_overhead
from feedfast.meter.report import flatten
from feedfast.meter.samplers import CpuSampler, Sampler
from feedfast.meter.stats import verdict

__all__ = [
    "CpuSampler",
    "CudaEvents",
    "EventFactory",
    "ManualClock",
    "NvmlSampler",
    "Sampler",
    "SimulatedGpu",
    "StallMeter",
    "TimingEvent",
    "flatten",
    "infer_batch_size",
    "measure_overhead",
    "verdict",
]
