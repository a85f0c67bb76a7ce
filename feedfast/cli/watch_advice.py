"""What to do next after ``feedfast watch``: ranked advice from a loader's figures and the machine.

Pure arithmetic on measured figures, in the words of ``feedfast analyze``
(:mod:`feedfast.cli.recommend`): not input-bound (stop here); input-bound with idle cores
(more workers, by :func:`feedfast.cli.advice.threads_needed`'s linear model); input-bound with
busy cores, or more workers needed than there are cores (decode on the GPU: the
``feedfast.DataLoader(...)`` line for this job's data, and the ``feedfast bench`` run that
predicts it).

The model, per step of the rank that waited most (DDP runs at its pace): ``T`` the step
(wait plus compute), ``W`` the host wait, ``C = T - W`` the compute. A loader with workers
(``num_workers`` > 0) makes batches beside the step, so an input-bound loop gets one every
``T``; with ``k`` workers instead of ``w``, one every ``T * w / k``. Without workers the
training process loads each batch itself, in ``W``, and ``k`` workers make one every
``W / k`` beside the step. Either way the predicted step is ``max(C, loader time)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from feedfast.cli.advice import threads_needed
from feedfast.meter.stats import TOO_FEW

BUSY_CPU = 85.0
"""Mean use of each core (percent, the whole machine) from which the cores count as busy."""
SHIPPED_SPEC = "imagenet-train"
"""The pipeline a GPU-decode line names: decode, random_resized_crop 224, flip, normalize."""


@dataclass(frozen=True)
class Machine:
    """What the advice needs of the machine.

    Attributes:
        cores_per_rank: usable cores over the ranks on the straggler's host.
        cpu_busy: mean use of each core during the run (percent; None: not sampled).
        cuda: whether the job's processes used CUDA.
    """

    cores_per_rank: int
    cpu_busy: float | None
    cuda: bool


@dataclass(frozen=True)
class StepTimes:
    """Mean seconds of one step, and its samples, on one rank."""

    step: float
    wait: float
    samples: float

    @classmethod
    def of(cls, figures: dict[str, Any]) -> StepTimes:
        """From a rank's figures: ``wall_s``, ``host_stall_fraction``, ``steps``, ``samples``."""
        steps = max(1, figures.get("steps") or 1)
        wall = figures.get("wall_s") or 0.0
        return cls(wall / steps, wall * (figures.get("host_stall_fraction") or 0.0) / steps,
                   (figures.get("samples") or 0) / steps)

    @property
    def compute(self) -> float:
        """The step without its wait."""
        return max(0.0, self.step - self.wait)

    def loader(self, workers: int) -> float:
        """The loader's time per batch now: the step with workers (it is what the loop waits on), else the wait."""
        return self.step if workers > 0 else self.wait

    def with_workers(self, now: int, then: int) -> float:
        """The predicted step with ``then`` workers instead of ``now``."""
        made = self.loader(now) * (now / then if now > 0 else 1 / then)
        return max(self.compute, made)


def _item(action: str, why: str, *, rank: bool = True, times: StepTimes | None = None, after: float | None = None,
          world: int = 1, command: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"action": action, "why": why, "applicable": rank, "command": command,
                           "predicted_speedup": None, "predicted_samples_per_s": None,
                           "predicted_stall_fraction": None}
    if times is not None and after is not None and after > 0:
        out.update(predicted_speedup=times.step / after, predicted_samples_per_s=times.samples * world / after,
                   predicted_stall_fraction=max(0.0, after - times.compute) / after)
    return out


def _workers(times: StepTimes, facts: dict[str, Any], machine: Machine, world: int) -> dict[str, Any]:
    now = int(facts.get("num_workers") or 0)
    torch_loader = facts.get("kind") == "torch"
    action = "more workers" if torch_loader else "more threads"
    spare = max(1, machine.cores_per_rank - 1) if torch_loader else machine.cores_per_rank  # the loop holds a core
    if machine.cpu_busy is not None and machine.cpu_busy >= BUSY_CPU:
        return _item(action, f"the cores are busy ({machine.cpu_busy:.0f}% each on average): {action} would "
                             "share them", rank=False)
    if times.compute <= 0 or times.loader(now) <= 0:
        return _item(action, "no compute time measured between batches", rank=False)
    need = threads_needed(max(now, 1), times.samples / times.compute, times.samples / times.loader(now))
    then = min(need, spare)
    cores = f"{machine.cores_per_rank} core{'s' if machine.cores_per_rank != 1 else ''} per rank"
    if then <= now:
        return _item(action, f"num_workers={now} already uses the {cores}", rank=False)
    how = ("loading leaves the training process and overlaps the step" if now == 0 else
           f"loading x{then / now:.2f}")
    short = f"; {need} would stop the wait, more than the cores allow" if need > then else ""
    return _item(f"{action} (num_workers={then})", f"{how}: workers {now} -> {then}, linear scaling up to {spare} "
                 f"on the {cores}{short}", times=times, after=times.with_workers(now, then), world=world)


def shard_pattern(data: dict[str, Any]) -> str:
    """A glob naming a loader's shards, from the few it lists and their count."""
    shards = [str(s) for s in data.get("shards") or []]
    if len(shards) == 1 and (data.get("count") or 1) == 1:
        return shards[0]
    folder = os.path.dirname(shards[0])
    names = [os.path.basename(s) for s in shards]
    return os.path.join(folder, os.path.commonprefix(names).rstrip("0123456789") + "*.tar")


def _gpu_decode(times: StepTimes, facts: dict[str, Any], machine: Machine) -> dict[str, Any]:
    step_ms = f"{times.compute * 1e3:.0f}"
    batch = facts.get("batch_size") or round(times.samples) or 1
    where = "" if machine.cuda else " (needs a GPU; this job used none)"
    data = facts.get("data") or {}
    if facts.get("kind") == "feedfast":
        if facts.get("placement") == "gpu":
            return _item("decode on the GPU", "the loader already decodes on the GPU (placement gpu)", rank=False)
        pattern = shard_pattern(data) if data.get("shards") else "SHARDS"
        spec = facts.get("spec_name") or "SPEC"
        return _item(f"decode on the GPU{where}: feedfast.DataLoader(..., placement=\"gpu\")",
                     "nvJPEG decode and GPU augmentation take the CPU's work; split fetch from prep first with "
                     f"`feedfast analyze {spec} --shards '{pattern}' --step-ms {step_ms}`",
                     rank=machine.cuda, command=f"feedfast analyze {spec} --shards '{pattern}' --step-ms {step_ms}")
    make = ""
    if data.get("kind") == "tar-shards":
        pattern = shard_pattern(data)
    elif data.get("kind") == "image-folder":  # read in place: no shards to write first
        pattern = str(data["path"]).rstrip(os.sep) + os.sep
    else:
        return _item("decode on the GPU", f"this job's dataset ({facts.get('dataset_class')}) names no tar shards "
                                          "or image folder; if it reads images from a folder or a file list, "
                                          "feedfast.DataLoader(SPEC, shards=\"DIR/\" or \"list.txt\") reads them in "
                                          "place; else write them as shards (`feedfast shards make DIR OUT`)",
                     rank=False)
    line = f'feedfast.DataLoader("{SHIPPED_SPEC}", shards="{pattern}", batch_size={batch})'
    bench = f"feedfast bench {SHIPPED_SPEC} --shards '{pattern}' --batch-size {batch} --step-ms {step_ms}"
    return _item(f"decode on the GPU{where}: {make}{line}",
                 f"nvJPEG decode and GPU augmentation take the CPU's work ({SHIPPED_SPEC}: decode, random_resized_crop"
                 f" 224, flip, normalize; write a spec if the job's transforms differ); predict the stall for this "
                 f"step with `{bench}`", rank=machine.cuda, command=bench)


def _pin(facts: dict[str, Any], machine: Machine) -> dict[str, Any] | None:
    if facts.get("kind") != "torch" or not machine.cuda or facts.get("pin_memory") is not False:
        return None
    return _item("pin_memory=True (and .to(device, non_blocking=True))",
                 "copies from pageable memory hold the loop while they run; the gain is not predicted here")


def advise(row: dict[str, Any], machine: Machine) -> list[dict[str, Any]]:
    """Ranked advice for one loader row of ``feedfast watch`` (its ``job``, ``ranks``, ``straggler`` and facts).

    Returns:
        Items with ``action``, ``why``, ``rank`` (1, 2, ...; None for the ones that do not
        apply, listed after with the reason), ``command`` and, where the model predicts
        them, ``predicted_speedup``, ``predicted_samples_per_s`` (all ranks) and
        ``predicted_stall_fraction`` (from host waits).
    """
    job, ranks = row["job"], row["ranks"]
    verdict = job["verdict"]
    if verdict in ("no steps measured", TOO_FEW):
        items = [_item("measure longer", f"{job.get('steps') or 0} steps measured; a verdict needs "
                                         f"{ranks[0].get('min_steps')} (a longer run, or a larger --steps)")]
    elif verdict == "not input-bound":
        items = [_item("none needed, stop here", f"the loader keeps up (data wait {job['stall_fraction']:.1%}, under "
                                                 f"5%; {job.get('samples_per_s') or 0:,.0f} samples/s delivered)")]
    else:
        worst = row.get("straggler") or {}
        figures = next((r for r in ranks if r["rank"] == worst.get("rank")), ranks[0])
        times, facts = StepTimes.of(figures), {**row["facts"], "kind": row["kind"]}
        workers = _workers(times, facts, machine, len(ranks))
        gpu = _gpu_decode(times, facts, machine)
        if workers["applicable"] and (workers["predicted_stall_fraction"] or 0.0) < 0.05:
            order = [workers, gpu]  # more workers are enough; GPU decode is the next step
        else:
            order = [gpu, workers] if gpu["applicable"] else [workers, gpu]
        items = [*order, *(p for p in [_pin(facts, machine)] if p)]
    ranked = [i for i in items if i["applicable"]]
    for n, item in enumerate(ranked, 1):
        item["rank"] = n
    return ranked + [dict(i, rank=None) for i in items if not i["applicable"]]
