"""Typed spec objects: what a validated pipeline spec holds. A spec is data."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from feedfast.ops.base import Param
from feedfast.spec.batchmix_settings import MixSettings
from feedfast.spec.runtime import LoaderSection, TuneSettings

ComponentKind = Literal["image", "label", "json", "npy", "bytes"]
LastBatch = Literal["partial", "pad", "drop"]
DevicePref = Literal["auto", "cpu", "gpu"]

COMPONENT_KINDS = ("image", "label", "json", "npy", "bytes")
MISSING_POLICIES = ("error", "skip", "empty")
ON_ERROR_POLICIES = ("raise", "skip")
CHECK_SECONDS = 2.0  # default ``source.check_seconds``: see feedfast.checks.worker
SHUFFLE_BLOCK = 16384  # default ``shuffle.block`` and ``shuffle.window``: see feedfast.order.block.block_order
SHUFFLE_WINDOW = 32
LAST_BATCH_POLICIES = ("partial", "pad", "drop")
DEVICES = ("auto", "cpu", "gpu")


DECODER_PARAMS = (
    Param("hw_decoder_load", "float", 0.65,
          "share of JPEG decoding sent to the hardware JPEG decoder (A100, H100, H200); the rest runs on "
          "CUDA cores", low=0.0, high=1.0),
    Param("device_memory_padding", "int", 211_025_920,
          "bytes of GPU memory nvJPEG allocates ahead per buffer, so that a larger image does not reallocate",
          low=0),
    Param("host_memory_padding", "int", 140_544_512,
          "bytes of pinned host memory nvJPEG allocates ahead per buffer, likewise", low=0),
    Param("preallocate_width_hint", "int", 5980,
          "widest image the hardware decoder preallocates for (0: no preallocation)", low=0, high=65535),
    Param("preallocate_height_hint", "int", 6430,
          "tallest image the hardware decoder preallocates for (0: no preallocation)", low=0, high=65535),
)
"""The ``decoder`` section's keys: DALI's ``mixed`` (nvJPEG) decoder arguments, NVIDIA's values
for ImageNet on A100/H100-class GPUs (see ``docs/spec-reference.md`` for where each comes from)."""
_DECODER_DEFAULTS = {p.name: p.default for p in DECODER_PARAMS}


@dataclass(frozen=True)
class DecoderSettings:
    """The nvJPEG settings of GPU (``mixed``) decoding; a CPU decode never receives them.

    The defaults are those of :data:`DECODER_PARAMS`.
    """

    hw_decoder_load: float = _DECODER_DEFAULTS["hw_decoder_load"]
    device_memory_padding: int = _DECODER_DEFAULTS["device_memory_padding"]
    host_memory_padding: int = _DECODER_DEFAULTS["host_memory_padding"]
    preallocate_width_hint: int = _DECODER_DEFAULTS["preallocate_width_hint"]
    preallocate_height_hint: int = _DECODER_DEFAULTS["preallocate_height_hint"]

    def to_dict(self) -> dict[str, Any]:
        """The settings as the spec's ``decoder`` section (the keys are DALI's argument names)."""
        return dataclasses.asdict(self)

    def args_for(self, device: str) -> dict[str, Any]:
        """The decoder arguments of a node placed on ``device``: all of them on ``mixed``, none elsewhere.

        DALI's CPU decoder ignores nvJPEG settings; leaving them out keeps CPU graphs and CPU
        plans free of settings that do nothing there.
        """
        return self.to_dict() if device == "mixed" else {}


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
        check_seconds: CPU seconds an image check may take, plus the time its pixel count needs
            (:mod:`feedfast.checks.worker`; the wall clock may run up to 20 times longer on a
            busy machine); a check that runs longer is ``bad``.
        fields: the field pipelines by output field name.
        outputs: the fields the loader yields, in order.
        output_form: ``tuple`` (outputs was a list) or ``dict``.
        batch_size, last_batch: batching; see :mod:`feedfast.loader` for the policies.
        mix: the batch-level mixup / cutmix (``batch.mix``, :mod:`feedfast.ops.batchmix`), or None.
        repeats: repeated augmentation (``shuffle.repeats``): each sample read this many times an epoch,
            each copy with its own draws (:mod:`feedfast.order.repeats`); 1 turns it off.
        device: ``auto``, ``cpu`` or ``gpu`` placement of the pipeline.
        seed: the seed of every random choice (shuffling and augmentation).
        shuffle_buffer: samples held for shuffling (0 turns sample shuffling off).
        shuffle_shards: whether the shard order changes every epoch.
        shuffle_block, shuffle_window: the block shuffle of remote shards (``shuffle.block``,
            ``shuffle.window``): windows of ``shuffle_window`` consecutive samples, each spread
            over about ``shuffle_block`` samples (see :func:`feedfast.order.block.block_order`).
        decoder: the nvJPEG settings of GPU decoding (the ``decoder`` section).
        loader, tune: how the loader runs and whether it tunes itself (:mod:`feedfast.spec.runtime`).
        file: where the spec came from, for error messages.
    """

    name: str
    components: dict[str, Component]
    fields: dict[str, FieldPipeline]
    outputs: tuple[str, ...]
    output_form: Literal["tuple", "dict"] = "tuple"
    missing: str = "error"
    on_error: str = "raise"
    check_seconds: float = CHECK_SECONDS
    batch_size: int = 64
    last_batch: LastBatch = "partial"
    mix: MixSettings | None = None
    repeats: int = 1
    device: DevicePref = "auto"
    seed: int = 0
    shuffle_buffer: int = 0
    shuffle_shards: bool = False
    shuffle_block: int = SHUFFLE_BLOCK
    shuffle_window: int = SHUFFLE_WINDOW
    decoder: DecoderSettings = field(default_factory=DecoderSettings)
    loader: LoaderSection = field(default_factory=LoaderSection)
    tune: TuneSettings = field(default_factory=TuneSettings)
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
                **({"check_seconds": self.check_seconds} if self.check_seconds != CHECK_SECONDS else {}),
            },
            "pipeline": pipeline,
            "outputs": list(self.outputs) if self.output_form == "tuple" else {o: o for o in self.outputs},
            "batch": {"size": self.batch_size, "last_batch": self.last_batch,
                      **({"mix": self.mix.to_dict()} if self.mix is not None else {})},
            "shuffle": {"buffer": self.shuffle_buffer, "shards": self.shuffle_shards, "block": self.shuffle_block,
                        "window": self.shuffle_window, **({"repeats": self.repeats} if self.repeats != 1 else {})},
            "device": self.device,
            "decoder": self.decoder.to_dict(),
            "seed": self.seed,
            **({"loader": self.loader.to_dict()} if self.loader.to_dict() else {}),
            **({"tune": self.tune.to_dict()} if self.tune != TuneSettings() else {}),
        }

    @property
    def shuffled(self) -> bool:
        """Whether epochs are shuffled (``shuffle.buffer > 0`` or ``shuffle.shards``)."""
        return self.shuffle_buffer > 0 or self.shuffle_shards

    def replace(self, **changes: Any) -> "Spec":
        """A copy with some top-level settings changed (already validated by the caller)."""
        return dataclasses.replace(self, **changes)
