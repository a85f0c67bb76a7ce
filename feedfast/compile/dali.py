"""Emit a plan as a DALI pipeline: the webdataset reader, then one DALI op per node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from feedfast.compile import shapes
from feedfast.compile.dali_draws import FedDraws, fed_draws
from feedfast.compile.plan import Node, Plan
from feedfast.errors import BackendError
from feedfast.ops import _dali as d
from feedfast.ops.registry import OPS
from feedfast.spec.model import DecoderSettings

READER_NAME = "Reader"


@dataclass
class EmitContext:
    """What an emitter needs to know about where its node runs.

    ``decoder_args`` are the keyword arguments each decoder of the node takes: the spec's
    nvJPEG settings on the ``mixed`` device, none on the CPU (``DecoderSettings.args_for``).
    """

    device: str
    decoder_device: str
    in_hw: tuple[Any, Any] | None = None
    decoder_args: dict[str, Any] = field(default_factory=dict)
    layout: str = ""
    channels: int | None = None
    """The node's output channels where its signature knows them (1 after a gray decode)."""
    fed: dict[str, Any] = field(default_factory=dict)
    """The node's draws fed as data (:mod:`feedfast.compile.dali_draws`), by name; empty: DALI's generator."""


@dataclass
class ReaderConfig:
    """Where samples come from: the webdataset reader's arguments, or a batch callable.

    ``seed`` is given to the reader explicitly so that it does not draw from the
    pipeline's sequence of operator seeds, as ``external_source`` does not: the random
    operators after either source then get the same seeds, and the same augmentation.
    With ``feed`` set (the stream transport), ``fn.external_source`` calls it in the
    pipeline's thread with a ``BatchInfo`` per iteration (it reads ahead in its own
    threads), and ``stream`` names each step's samples (``stream.origins(step, size)``)
    and finds undecodable ones (``stream.bad_sample``): see ``feedfast.loader.backends.dali.stream``.
    A feed returns each step's draws after its components where the plan's nodes take them
    (:func:`~feedfast.compile.dali_draws.fed_draws`), and those nodes are emitted with them.
    """

    paths: list[str]
    index_paths: list[str]
    shard_id: int = 0
    num_shards: int = 1
    shuffle_buffer: int = 0
    missing: str = "error"
    stick_to_shard: bool = True
    seed: int | None = None
    feed: Callable[[Any], Any] | None = None
    stream: Any = None


@dataclass
class DaliOutputs:
    """Which pipeline output holds what: DALI field outputs, then raw components (none from a feed, whose
    ``stream`` names the samples and hands over the components only host ops read: ``fed`` lists those
    DALI takes, in the order the feed returns them)."""

    fields: list[str]
    raw: list[str]
    deferred: dict[str, dict[str, Any]] = field(default_factory=dict)
    stream: Any = None
    fed: list[int] = field(default_factory=list)


def dali_components(plan: Plan) -> list[int]:
    """The components DALI itself reads: those a node that runs in DALI, or an output, takes. A component only
    host ops read (a ``.cls`` label) need not pass through DALI when feedfast's feed reads it."""
    count = len(plan.components)
    used = {i for n in plan.nodes[count:] if n.device != "host" for i in n.inputs if i < count}
    used.update(nid for nid in plan.outputs.values() if nid < count)
    return sorted(used) or [0]


def emit(plan: Plan, reader: ReaderConfig) -> tuple[list[Any], DaliOutputs]:
    """Build the graph inside an open ``with pipe:`` block; return outputs and their map.

    Behind DALI's reader, fields computed on the host (generic ops) are fed by raw component
    outputs, and the first component's ``source_info`` names each sample's shard and key. Behind
    a feed (``reader.feed``), DALI is given only the components it reads (:func:`dali_components`)
    and returns no raw output: ``reader.stream`` names the samples and hands over the rest.
    """
    exts = [plan.nodes[i].params["ext"] for i in range(len(plan.components))]
    fed = dali_components(plan) if reader.feed is not None else list(range(len(exts)))
    draws = fed_draws(plan) if reader.feed is not None else None
    raw = _source(reader, [exts[c] for c in fed], draws)
    raw, fed_inputs = raw[:len(fed)], (draws.inputs(raw[len(fed):]) if draws is not None else {})
    values: dict[int, Any] = dict(zip(fed, raw))
    sizes: dict[int, Any] = {}
    for n in plan.nodes[len(plan.components):]:
        if n.device == "host" or n.deferred:
            continue
        x, src = values[n.inputs[0]], n.inputs[0]
        if n.device == "gpu" and plan.nodes[src].device in ("cpu", "host"):
            x = x.gpu()  # a per-op override: decoded on the CPU, augmented on the GPU
        values[n.id] = emit_node(n, x, sizes.get(src), decoder=plan.spec.decoder, fed=fed_inputs.get(n.id))
        sizes[n.id] = shapes.out_hw(n, sizes.get(src), x if plan.nodes[src].op == "read" else None)
    fields, outs, deferred = [], [], {}
    for name, nid in plan.outputs.items():
        node = plan.nodes[nid]
        if node.deferred:  # cheap transfer: ship uint8, normalize on the consumer's device
            fields.append(name)
            outs.append(values[node.inputs[0]])
            deferred[name] = node.params
        elif node.device != "host":
            fields.append(name)
            outs.append(values[nid])
    if reader.feed is not None and outs:  # the feed names its samples and hands host-only components over itself
        return outs, DaliOutputs(fields, [], deferred, reader.stream, fed)
    if reader.feed is not None:  # nothing for DALI to compute (labels only): it passes the fed bytes through
        return raw, DaliOutputs(fields, [plan.components[c] for c in fed], deferred, reader.stream, fed)
    return outs + raw, DaliOutputs(fields, list(plan.components), deferred, reader.stream, fed)


def _source(reader: ReaderConfig, exts: list[str], draws: FedDraws | None = None) -> list[Any]:
    """The raw component outputs: DALI's webdataset reader, or an external source over ``reader.feed`` (then
    the ``draws`` after the components: float32 pairs of a window, then int32 flags, see :class:`FedDraws`)."""
    if reader.feed is not None:
        t = d.types()
        windows = 2 if draws is not None and draws.window is not None else 0
        extra = draws.outputs if draws is not None else 0
        dtypes = [t.UINT8] * len(exts) + [t.FLOAT] * windows + [t.INT32] * (extra - windows)
        # not parallel=True: two live pipelines with parallel external sources corrupt data (DALI 2.4)
        return list(d.fn().external_source(
            source=reader.feed, num_outputs=len(exts) + extra, batch=True, batch_info=True, dtype=dtypes,
            ndim=[1] * (len(exts) + windows) + [0] * (extra - windows),
            no_copy=bool(getattr(reader.feed, "retains", False)),  # a feed whose buffers outlive DALI's use
        ))
    raw = d.fn().readers.webdataset(
        paths=reader.paths, index_paths=reader.index_paths, ext=exts,
        # samples left out are already out of the (filtered) index: anything else missing is an error
        missing_component_behavior="empty" if reader.missing == "empty" else "error",
        shard_id=reader.shard_id, num_shards=reader.num_shards, pad_last_batch=True,
        stick_to_shard=reader.stick_to_shard, case_sensitive_extensions=False, random_shuffle=reader.shuffle_buffer > 0,
        initial_fill=max(reader.shuffle_buffer, 1), name=READER_NAME,
        **({"seed": reader.seed} if reader.seed is not None else {}),
    )
    return raw if isinstance(raw, list) else [raw]


def _channels(sig: Any) -> int | None:
    """Channels of an image signature (the C of its HWC or CHW shape), None where unknown."""
    if sig.layout not in ("HWC", "CHW") or len(sig.shape) != 3:
        return None
    c = sig.shape[2] if sig.layout == "HWC" else sig.shape[0]
    return c if isinstance(c, int) else None


def emit_node(n: Node, x: Any, in_hw: Any = None, *, decoder: DecoderSettings | None = None,
              fed: dict[str, Any] | None = None) -> Any:
    """One node as DALI ops.

    Args:
        n: the node.
        x: its input DataNode.
        in_hw: the input's per-sample (height, width) on the CPU.
        decoder: the spec's nvJPEG settings (defaults when None), given to a ``mixed`` decode.
        fed: its draws fed as data, by name (:mod:`feedfast.compile.dali_draws`); None: DALI's generator.
    """
    ctx = EmitContext(
        device=d.dali_device(n.device),
        decoder_device="mixed" if n.device in ("mixed", "gpu") else "cpu",
        in_hw=in_hw,
        decoder_args=(decoder or DecoderSettings()).args_for(n.device),
        layout=n.sig.layout,
        channels=_channels(n.sig),
        fed=fed or {},
    )
    parts = n.op.split("+")
    if len(parts) > 1:  # a fused node (passes.fuse): its last op's declared form takes the others
        last = OPS[parts[-1]]
        if last.dali_after_decode is not None and len(parts) == 2:
            return last.dali_after_decode.emit(ctx, n.params[parts[0]], n.params[parts[1]], x)
        if last.dali_folded is None:
            raise BackendError(f"fused node `{n.op}` ({n.key}) has no DALI form")
        return last.dali_folded(ctx, n.params, x)
    emitter = OPS[n.op].dali
    if emitter is None:
        raise BackendError(f"op `{n.op}` ({n.key}) has no DALI form")
    return emitter(ctx, n.params, x)


def build_pipeline(
    plan: Plan,
    reader: ReaderConfig,
    *,
    batch_size: int,
    num_threads: int,
    device_id: int | None,
    seed: int,
    prefetch_queue_depth: int = 2,
    checkpoint: str | None = None,
) -> tuple[Any, DaliOutputs]:
    """A DALI Pipeline for the plan (not yet built). ``device_id=None`` means CPU only."""
    try:
        from nvidia.dali import Pipeline
    except ImportError as exc:
        raise BackendError(
            "NVIDIA DALI is not installed: pip install 'feedfast[cuda12]' (or [cuda13]), "
            "or use backend='pil'"
        ) from exc
    settings = dict(
        batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
        prefetch_queue_depth=prefetch_queue_depth, enable_checkpointing=True, checkpoint=checkpoint,
        exec_dynamic=True,
    )
    if needs_conditionals(plan):
        return _conditional_pipeline(plan, reader, settings)
    pipe = Pipeline(**settings)
    with pipe:
        outs, omap = emit(plan, reader)
        pipe.set_outputs(*outs)
    return pipe, omap


def needs_conditionals(plan: Plan) -> bool:
    """Whether an op of the plan declares that its DALI form needs ``enable_conditionals`` (``auto_aug``)."""
    return any(OPS[op].conditionals for n in plan.nodes if n.op != "read" for op in n.op.split("+"))


def _conditional_pipeline(plan: Plan, reader: ReaderConfig, settings: dict[str, Any]) -> tuple[Any, DaliOutputs]:
    """The pipeline built through ``pipeline_def(enable_conditionals=True)``, as DALI's conditionals need."""
    from nvidia.dali import pipeline_def

    made: list[DaliOutputs] = []

    @pipeline_def(enable_conditionals=True)
    def graph() -> tuple[Any, ...]:
        outs, omap = emit(plan, reader)
        made.append(omap)
        return tuple(outs)

    pipe = graph(**settings)
    return pipe, made[0]
