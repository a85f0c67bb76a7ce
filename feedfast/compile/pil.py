"""Compile a spec for the portable backend: one per-sample program of the registry's PIL emitters.

The program comes from an unfused CPU plan (``build_plan(spec, device="cpu", fuse=False)``,
consumer ``cpu``), so every step is one registry op with its ``pil`` emitter: no fused
``decode+random_resized_crop`` or ``center_crop+flip+normalize`` nodes, and ``normalize`` is
never deferred (the portable backend normalizes in its workers). Shared deterministic steps
stay shared, as in the DALI graph: one decode can feed several views.

An op whose ``pil`` emitter is None fails here, before any data moves, with a
:class:`~feedfast.errors.BackendError` naming the op, the spec file and the key.

EXIF orientation: both backends ignore it. DALI's decoder does not apply it by default, and
``decode`` here does not call ``ImageOps.exif_transpose``, so a file gives the same pixels
either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from feedfast.checks.decoders import open_image
from feedfast.compile.build import build_plan
from feedfast.errors import BackendError
from feedfast.ops.base import Rng, Signature, stream_for
from feedfast.ops.generic import DecodeFailure
from feedfast.ops.registry import OPS
from feedfast.spec.model import Spec


@dataclass(frozen=True)
class PilStep:
    """One step of a PIL program.

    Attributes:
        id: position in ``PilProgram.steps``; inputs always come earlier.
        op: a registry op name, or ``read`` for a component's raw bytes.
        params: the op's parameters (for ``read``: ``component`` and ``ext``).
        inputs: ids of input steps (empty for ``read``).
        key: the spec key path of the op, for errors (``pipeline.image[1]``).
        sig: the step's declared output signature.
    """

    id: int
    op: str
    params: dict[str, Any]
    inputs: tuple[int, ...]
    key: str
    sig: Signature


@dataclass(frozen=True)
class PilProgram:
    """What the portable backend runs for each sample.

    Attributes:
        steps: the steps in topological order; the first ``len(components)`` are reads.
        components: the components read, in reader order (the plan's ``components``).
        exts: per component, the accepted extensions, lower case.
        outputs: output field name -> id of the step that produces it.
        signatures: output field name -> its declared signature (how batches are collated).
        file: the spec file, for errors.
    """

    steps: tuple[PilStep, ...]
    components: tuple[str, ...]
    exts: tuple[frozenset[str], ...]
    outputs: dict[str, int]
    signatures: dict[str, Signature]
    file: str

    def run(self, raw: Sequence[bytes], rng: Rng) -> dict[str, Any]:
        """One sample's output values by field, from its components' bytes (in ``components`` order).

        Raises:
            DecodeFailure: a step could not read the sample; the message names the op and key.
        """
        values = self.trace(raw, rng)
        return {name: values[sid] for name, sid in self.outputs.items()}

    def trace(self, raw: Sequence[bytes], rng: Rng) -> list[Any]:
        """Every step's value for one sample (what :meth:`run` picks the outputs from)."""
        values: list[Any] = [None] * len(self.steps)
        for step in self.steps:
            if step.op == "read":
                values[step.id] = raw[step.id]
                continue
            try:
                values[step.id] = _apply(step, values[step.inputs[0]], rng)
            except DecodeFailure as exc:
                raise DecodeFailure(f"`{step.op}` failed ({step.key}): {exc}") from None
        return values


def compile_pil(spec: Spec) -> PilProgram:
    """The spec's per-sample PIL program.

    Raises:
        BackendError: an op of the spec has no PIL form.
    """
    plan = build_plan(spec, device="cpu", consumer="cpu", fuse=False)
    steps = []
    for n in plan.nodes:
        if n.op != "read" and OPS[n.op].pil is None:
            raise BackendError(
                f"{spec.file}: {n.key}: op `{n.op}` has no PIL form, so the portable backend cannot run "
                "this spec; use backend='dali' or remove the op"
            )
        steps.append(PilStep(n.id, n.op, dict(n.params), n.inputs, n.key, n.sig))
    exts = tuple(plan.component_exts())
    return PilProgram(
        steps=tuple(steps), components=tuple(plan.components), exts=exts, outputs=dict(plan.outputs),
        signatures={name: plan.nodes[nid].sig for name, nid in plan.outputs.items()}, file=spec.file,
    )


_PIL_ERRORS: tuple[type[BaseException], ...] = (OSError, SyntaxError, ValueError, EOFError)


def own_draws(step: PilStep, rng: Rng) -> Rng:
    """The draws a step takes: a kernel's or tensor op's own stream (keyed by its step id, so the
    threaded path, which plans the geometry before them in C, gives them the same), else ``rng``."""
    form = OPS[step.op].threaded
    return stream_for(rng, step.id) if form is not None and form.role in ("kernel", "tensor") else rng


def _apply(step: PilStep, value: Any, rng: Rng) -> Any:
    emitter = OPS[step.op].pil
    form = OPS[step.op].threaded
    if form is not None and form.role == "tensor":  # a tensor op is told its input's layout
        return emitter(value, {**step.params, "layout": step.sig.layout}, own_draws(step, rng))  # type: ignore[misc]
    if form is None or form.role != "decode":
        return emitter(value, step.params, own_draws(step, rng))  # type: ignore[misc]
    from PIL import Image

    try:
        return emitter(open_image(value), step.params, rng)  # type: ignore[misc]
    except (*_PIL_ERRORS, Image.DecompressionBombError) as exc:
        what = "the component is empty" if not value else f"{type(exc).__name__}: {exc}"
        raise DecodeFailure(f"cannot decode the image ({what})") from None
