"""The CUDA-event logic of StallMeter, run on a CPU through the clock-backed stand-in.

Per step the fake loop launches ``gpu_ms`` of work (returns at once, like a kernel
launch), spends ``host_ms`` on the host, optionally synchronizes, then asks for the next
batch, which the loader hands over ``wait_ms`` later. Figures are exact on a manual clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from feedfast.meter import ManualClock, SimulatedGpu, StallMeter
from feedfast.meter.clock import SimulatedEvent


class Shaped:
    def __init__(self, n: int) -> None:
        self.shape = (n, 3)


def simulate(
    *,
    steps: int,
    wait_ms: float,
    host_ms: float,
    gpu_ms: float,
    sync: bool = False,
    warmup: int = 0,
) -> tuple[StallMeter, ManualClock]:
    clock = ManualClock()
    gpu = SimulatedGpu(clock=clock, sleep=clock.advance)
    meter = StallMeter(events=gpu, clock=clock, samplers=False, warmup=warmup, min_steps=1)

    def loader() -> Iterator[Shaped]:
        for _ in range(steps):
            clock.advance(wait_ms / 1e3)
            yield Shaped(4)

    for _batch in meter.wrap(loader()):
        gpu.launch(gpu_ms / 1e3)
        clock.advance(host_ms / 1e3)
        if sync:
            gpu.synchronize()
    return meter, clock


def test_gpu_drained_before_the_wait_idles_for_the_whole_wait() -> None:
    meter, clock = simulate(steps=20, wait_ms=5, host_ms=1, gpu_ms=6, sync=True)
    clock.advance(1.0)
    s = meter.summary()
    assert s["basis"] == "gpu-events" and "simulated" in s["basis_note"]
    assert s["steps"] == 20 and s["pending_events"] == 0
    # Step: 5 ms wait, 1 ms host work, then 5 ms more in synchronize().
    assert s["stall_fraction"] == pytest.approx(5 / 11)
    assert s["host_stall_fraction"] == pytest.approx(5 / 11)
    assert s["wait_p50_ms"] == pytest.approx(5.0)


def test_gpu_draining_inside_the_wait_idles_for_the_rest_of_it() -> None:
    # The GPU finishes each step's 6 ms of work 4 ms into the 10 ms wait: 6 ms idle.
    meter, clock = simulate(steps=20, wait_ms=10, host_ms=2, gpu_ms=6, warmup=1)
    clock.advance(1.0)
    s = meter.summary()
    assert s["steps"] == 19
    assert s["wait_p50_ms"] == pytest.approx(6.0) and s["wait_max_ms"] == pytest.approx(6.0)
    assert s["stall_fraction"] == pytest.approx(6 / 12)
    assert s["host_stall_fraction"] == pytest.approx(10 / 12)


def test_queued_work_hides_the_wait_and_events_resolve_lazily() -> None:
    # 20 ms of GPU work per 12 ms host cycle: the queue only grows, the GPU never idles
    # after the first wait, although the host waits 10 ms of every 12.
    meter, clock = simulate(steps=30, wait_ms=10, host_ms=2, gpu_ms=20, warmup=1)
    before = meter.summary()
    assert before["pending_events"] > 0
    assert before["steps"] < 29, "steps whose events have not completed must not count yet"
    assert before["stall_fraction"] == pytest.approx(0.0)
    clock.advance(1.0)
    after = meter.summary()
    assert after["pending_events"] == 0 and after["steps"] == 29
    assert after["stall_fraction"] == pytest.approx(0.0)
    assert after["host_stall_fraction"] == pytest.approx(10 / 12)
    assert after["verdict"] == "not input-bound"
    assert after["required_samples_per_s"] == pytest.approx(after["samples_per_s"])


def test_first_step_on_an_idle_gpu_counts_its_whole_wait() -> None:
    meter, clock = simulate(steps=3, wait_ms=10, host_ms=2, gpu_ms=20)
    clock.advance(1.0)
    s = meter.summary()
    assert s["steps"] == 3 and s["wait_max_ms"] == pytest.approx(10.0)
    assert s["wait_s"] == pytest.approx(0.010) and s["wait_p50_ms"] == pytest.approx(0.0)


def test_events_on_a_real_clock_match_the_truth_timed_by_the_loop() -> None:
    gpu = SimulatedGpu()
    meter = StallMeter(events=gpu, samplers=False, warmup=0)  # the truth counts every step
    idle, start = 0.0, time.perf_counter()
    for i in range(20):
        asked, drained = time.perf_counter(), gpu.busy_until
        with meter.wait(batch_size=4):
            time.sleep(0.010)
        idle += max(0.0, time.perf_counter() - max(asked, drained))
        time.sleep(0.010)
        gpu.launch(0.005 if i % 2 else 0.008)  # launched last: runs into the next wait
    meter.stop()
    truth = idle / (time.perf_counter() - start)
    time.sleep(0.02)
    s = meter.summary()
    assert s["steps"] == 20 and s["samples"] == 80 and s["pending_events"] == 0
    assert 0.40 < s["host_stall_fraction"] < 0.60
    assert abs(s["stall_fraction"] - truth) < 0.02, (s["stall_fraction"], truth)
    assert s["stall_fraction"] < s["host_stall_fraction"] - 0.05


def test_simulated_event_semantics() -> None:
    clock = ManualClock()
    gpu = SimulatedGpu(clock=clock, sleep=clock.advance)
    start = gpu()
    start.record()
    gpu.launch(0.010)
    end = gpu()
    end.record()
    assert start.query() and not end.query() and not gpu.idle()
    assert start.elapsed_ms(end) == pytest.approx(10.0)
    gpu.synchronize()
    assert end.query() and gpu.idle() and clock() == pytest.approx(0.010)
    with pytest.raises(ValueError):
        start.elapsed_ms(SimulatedEvent(gpu))
