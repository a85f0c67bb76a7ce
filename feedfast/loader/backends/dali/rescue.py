"""Running on after DALI fails a batch: the image that broke it, re-encoded as PNG, in its place.

Under ``on_error: raise`` only image headers are checked before an epoch, so an image with
a sound header that DALI's CPU decoder rejects mid-decode (a PNG with a bad chunk CRC, a
JPEG with junk between its segments) fails the batch that holds it; DALI has no per-sample
skip, and its pipeline is then unusable. The DALI backend recovers as follows:

1. the images of the steps DALI had in flight (the failed step and the ``depth`` after it)
   are read again and each is given to a check worker (``rescue`` job, under the spec's
   ``source.check_seconds``): DALI's CPU decoder first; an image it rejects must then decode
   with PIL, which re-encodes it losslessly as PNG;
2. an image neither decodes stops the epoch with a :class:`~feedfast.errors.SampleError`
   naming shard, key and both decoders' reasons; if no image is to blame on the CPU (a GPU
   decoder or another operator failed), the failure is named from DALI's message
   (:func:`~feedfast.loader.backends.dali.diagnose.diagnose`);
3. otherwise the rescued samples are remembered (for this loader's later epochs too) and the
   epoch goes on from the failed step in a new pipeline (for the loader's life, :mod:`.life`) fed by
   feedfast's stream transport
   (:mod:`feedfast.loader.backends.dali.stream`), which hands DALI a PNG in place of each rescued image, re-encoded by PIL as
   the step is read (a few milliseconds an image: only keys are held, not pixels).

Every sample stays where it was: the epoch's order, its length and its counts are those of
the run without the bad file. The augmentation draws of the steps after the failure come
from a new pipeline (seeded as the epoch's), so they differ from what DALI would have drawn;
they are the same on every run. A state taken after a rescue holds the rescued keys and the
step the new pipeline started at (:func:`wrap_checkpoint`), so it resumes exactly, in
another process too: the images are rescued again from the shards.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from feedfast.checks.decoders import Rescued
from feedfast.checks.second_decode import rescue_png
from feedfast.checks.worker import Failed, pool
from feedfast.compile.plan import Plan
from feedfast.errors import SampleError
from feedfast.loader.backends.dali.diagnose import HINT, diagnose
from feedfast.loader.backends.dali.stream import StreamEpoch
from feedfast.loader.backends.pil_warnings import routed
from feedfast.shards.transport import schemes
from feedfast.sources.mixture import Dataset

log = logging.getLogger("feedfast.dali")

RESCUABLE_KINDS = schemes.RESCUABLE_KINDS  # what the stream transport reads (the registry's `rescue`)
_MARK = "feedfast-rescue/1\n"

Where = tuple[str, str]  # (shard, key)


@dataclass
class Patches:
    """Rescued samples: (shard, key) -> the raw component numbers fed as PNG, and why."""

    images: dict[Where, set[int]] = field(default_factory=dict)
    reasons: dict[Where, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.images)

    def add(self, where: Where, component: int, rescued: Rescued) -> None:
        self.images.setdefault(where, set()).add(component)
        self.reasons.setdefault(where, rescued.reason)


def image_components(plan: Plan) -> list[int]:
    """The raw component numbers (reader outputs) that hold images."""
    return [i for i, name in enumerate(plan.components) if plan.spec.components[name].kind == "image"]


def rescuable(shards: Dataset) -> bool:
    """Whether the feed can read these shards' steps again to find what DALI failed on (every kind but a stream)."""
    return all(kind in RESCUABLE_KINDS for kind in shards.read_kinds)


def patch_step(stream: StreamEpoch, step: int, arrays: list[Any], patches: Patches) -> list[Any]:
    """Step ``step``'s TensorLists as fed (one per component DALI takes, then its draws, which stand: a PNG
    has its image's size), with each rescued image as PNG in place."""
    fed = stream.feeder.dali
    patched: list[Any] | None = None
    for i, where in enumerate(stream.origins(step, stream.batch_size)):
        for c in sorted(patches.images.get(where, ())):
            patched = patched or [[np.array(sample) for sample in column] for column in arrays[:len(fed)]] + \
                list(arrays[len(fed):])
            column = patched[fed.index(c)]
            with routed(where):  # PIL read it in a check worker, under the time limit, already
                png = rescue_png(column[i].tobytes())  # PIL's re-encoding, else DALI's own pixels
            column[i] = np.frombuffer(png, dtype=np.uint8)
    return patched or arrays


def examine(stream: StreamEpoch, steps: range, components: list[int], patches: Patches, *, max_pixels: int,
            seconds: float) -> list[Where]:
    """Rescue the images of ``steps`` that DALI's CPU decoder rejects; return the samples newly rescued.

    Raises:
        SampleError: an image neither DALI nor PIL decodes (the first in reading order).
    """
    seen: set[Where] = set()
    jobs: list[tuple[Where, int, bytes]] = []
    for step in steps:
        arrays = stream.feeder.batch(step)
        for i, where in enumerate(stream.origins(step, stream.batch_size)):
            if where in seen or where in patches.images:
                continue
            seen.add(where)
            jobs += [(where, c, arrays[c][i].tobytes()) for c in components]
    # every answer first: the pool stays locked until its map ends, and an error below must not leave it so
    answers = list(pool().map((("rescue", data, max_pixels) for _, _, data in jobs),
                              labels=(f"{s!r}, sample {k!r}" for (s, k), _, _ in jobs), seconds=seconds))
    found: list[Where] = []
    for (where, c, _), answer in zip(jobs, answers):
        if isinstance(answer, Rescued):
            patches.add(where, c, answer)
            found.append(where)
        elif isinstance(answer, Failed) or answer.status == "bad":
            raise SampleError("DALI could not decode a sample", shard=where[0], key=where[1],
                              reason=f"{answer.reason}; {HINT}")
    return list(dict.fromkeys(found))


def in_flight(exc: RuntimeError, stream: StreamEpoch, steps: range, plan: Plan, patches: Patches,
              shards: Dataset, *, max_pixels: int) -> None:
    """Rescue the images of the steps DALI had in flight when it failed (``steps``, from the failed one), or raise
    what failed: the image neither decoder reads, else what DALI's message names
    (:func:`~feedfast.loader.backends.dali.diagnose.diagnose`).

    Raises:
        SampleError: an image of the steps in flight that neither DALI nor PIL decodes, or (no image being to blame
            on the CPU) the sample DALI's message names.
        FeedfastError: nothing names a sample.
    """
    found = examine(stream, steps, image_components(plan), patches, max_pixels=max_pixels,
                    seconds=plan.spec.check_seconds) if rescuable(shards) else []
    if not found:  # a GPU decoder or another operator failed, or the shards cannot be read again
        raise diagnose(exc, plan, steps.start, stream, max_pixels=max_pixels) from exc
    for where in found:
        log.info("shard %r, sample %r: %s", where[0], where[1], patches.reasons[where])


def rescue_keys(stream: StreamEpoch, keys: list[Where], components: list[int], patches: Patches, *,
                max_pixels: int, seconds: float) -> None:
    """Rescue the images of ``keys`` again (resuming a state taken after a rescue, maybe in a new process).

    Raises:
        SampleError: one of them is no longer rescued (the shard changed).
    """
    wanted = {where for where in keys if where not in patches.images}
    rows: list[int] = []
    for first in range(0, len(stream.rows) if wanted else 0, 8192):  # one pass over the rank's keys
        where = stream.rows.take(np.arange(first, min(len(stream.rows), first + 8192)))
        rows += [first + i for i, (s, k) in enumerate(zip(where.shard.tolist(), stream.rows.index.batch_keys(where)))
                 if (stream.names[s], k) in wanted]
    steps = sorted({r // stream.batch_size for r in rows})
    for step in steps:
        examine(stream, range(step, step + 1), components, patches, max_pixels=max_pixels, seconds=seconds)
    lost = wanted - set(patches.images)
    if lost:
        shard, key = sorted(lost)[0]
        raise SampleError("a state to resume names a rescued image that DALI now decodes or that is gone",
                          shard=shard, key=key, reason="the shard changed since the state was taken; "
                          "resume from the start of the epoch")


def wrap_checkpoint(checkpoint: str, first_step: int, keys: list[Where], *, iteration: int | None = None) -> str:
    """A DALI checkpoint of a fed pipeline, with what rebuilding it needs: the rescued keys, and the DALI iteration
    a pipeline restored from it resumes at (a lifelong pipeline's, :mod:`.life`; None: the step's number less
    ``first_step``, as a pipeline per epoch numbered them)."""
    data: dict[str, Any] = {"first_step": first_step, "rescued": [list(k) for k in keys], "dali": checkpoint}
    if iteration is not None:
        data["iteration"] = iteration
    return _MARK + json.dumps(data)


def wrapped_iteration(checkpoint: str | None) -> int | None:
    """The DALI iteration a wrapped checkpoint resumes at, None where it does not say."""
    if checkpoint is None or not checkpoint.startswith(_MARK):
        return None
    iteration = json.loads(checkpoint[len(_MARK):]).get("iteration")
    return None if iteration is None else int(iteration)


def unwrap_checkpoint(checkpoint: str | None) -> tuple[str | None, int, list[Where]]:
    """(DALI checkpoint, first step, rescued keys) of a checkpoint :func:`wrap_checkpoint` may have made."""
    if checkpoint is None or not checkpoint.startswith(_MARK):
        return checkpoint, 0, []
    data = json.loads(checkpoint[len(_MARK):])
    return data["dali"], int(data["first_step"]), [(str(s), str(k)) for s, k in data["rescued"]]
