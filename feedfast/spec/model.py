"""Typed spec objects: what a validated pipeline spec holds. A spec is data."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

ComponentKind = Literal["image", "label", "json", "npy", "bytes"]
LastBatch = Literal["partial", "pad", "drop"]
DevicePref = Literal["auto", "cpu", "gpu"]

COMPONENT_KINDS = ("image", "label", "json", "npy", "bytes")
MISSING_POLICIES = ("error", "skip", "empty")
ON_ERROR_POLICIES = ("raise", "skip")
LAST_BATCH_POLICIES = ("partial", "pad", "drop")
DEVICES = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class Component:
    """A component of each sample: a name, the tar extensions it matches, and its kind."""

    name: str
    ext: str
    kind: ComponentKind


@dataclass(frozen=True)
class OpCall:
    """One op in a field pipeline, with every parameter filled in (defaults included).

    ``device`` is ``auto`` (follow the pipeline's placement) or a per-op ``cpu``/``gpu``.
    """

    op: str
    params: dict[str, Any]
    device: str = "auto"
    key: str = ""


@dataclass(frozen=True)
class FieldPipeline:
    """The ops that turn one component into one output field."""

    name: str
    source: str
    ops: tuple[OpCall, ...]
    key: str


@dataclass(frozen=True)
class Spec:
    """A validated pipeline spec.

    Attributes:
        name: a label for reports.
        components: the sample's components by name.
        missing: what to do when a sample lacks a component: ``error``, ``skip``, ``empty``.
        on_error: what to do with a sample that cannot be decoded: ``raise`` or ``skip``.
        fields: the field pipelines by output field name.
        outputs: the fields the loader yields, in order.
        output_form: ``tuple`` (outputs was a list) or ``dict``.
        batch_size, last_batch: batching; see :mod:`feedfast.loader` for the policies.
        device: ``auto``, ``cpu`` or ``gpu`` placement of the pipeline.
        seed: the seed of every random choice (shuffling and augmentation).
        shuffle_buffer: samples held for shuffling (0 turns sample shuffling off).
        shuffle_shards: whether the shard order changes every epoch.
        file: where the spec came from, for error messages.
    """

    name: str
    components: dict[str, Component]
    fields: dict[str, FieldPipeline]
    outputs: tuple[str, ...]
    output_form: Literal["tuple", "dict"] = "tuple"
    missing: str = "error"
    on_error: str = "raise"
    batch_size: int = 64
    last_batch: LastBatch = "partial"
    device: DevicePref = "auto"
    seed: int = 0
    shuffle_buffer: int = 0
    shuffle_shards: bool = False
    version: int = 1
    file: str = "<spec>"

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data, in the same shape a YAML file has."""
        pipeline: dict[str, Any] = {}
        for f in self.fields.values():
            ops = [{o.op: dict(o.params, **({"device": o.device} if o.device != "auto" else {}))} for o in f.ops]
            pipeline[f.name] = ops if f.source == f.name else {"from": f.source, "ops": ops}
        return {
            "version": self.version,
            "name": self.name,
            "source": {
                "components": {c.name: {"ext": c.ext, "kind": c.kind} for c in self.components.values()},
                "missing": self.missing,
                "on_error": self.on_error,
            },
            "pipeline": pipeline,
            "outputs": list(self.outputs) if self.output_form == "tuple" else {o: o for o in self.outputs},
            "batch": {"size": self.batch_size, "last_batch": self.last_batch},
            "shuffle": {"buffer": self.shuffle_buffer, "shards": self.shuffle_shards},
            "device": self.device,
            "seed": self.seed,
        }

    def replace(self, **changes: Any) -> "Spec":
        """A copy with some top-level settings changed (already validated by the caller)."""
        return dataclasses.replace(self, **changes)
