"""Validation of each section of a spec: source, pipeline, outputs, batch, shuffle, decoder, loader, tune."""

from __future__ import annotations

from typing import Any

from feedfast.errors import SpecError
from feedfast.ops.base import Signature, SignatureError
from feedfast.ops.registry import OPS, suggest
from feedfast.spec import model as m
from feedfast.spec.params import coerce
from feedfast.spec.runtime import BACKENDS, LoaderSection, TuneSettings

DEFAULT_COMPONENTS = {
    "image": {"ext": "jpg;jpeg;png", "kind": "image"},
    "label": {"ext": "cls", "kind": "label"},
}


def parse_scalar(raw: dict[str, Any], key: str, typ: type, default: Any, file: str,
                 choices: tuple[Any, ...] = ()) -> Any:
    """A top-level scalar setting, type- and choice-checked."""
    v = raw.get(key, default)
    if not isinstance(v, typ) or isinstance(v, bool) and typ is not bool or (choices and v not in choices):
        allowed = ("one of " + ", ".join(map(repr, choices))) if choices else f"a {typ.__name__}"
        raise SpecError(f"bad value for `{key}`", file=file, key=key, value=v, allowed=allowed,
                        fix=f"the default is {default!r}")
    return v


def _mapping(v: Any, key: str, file: str, example: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise SpecError("must be a mapping", file=file, key=key, value=v, fix=f"e.g. {example}")
    return v


def _no_unknown(d: dict[str, Any], allowed: tuple[str, ...], key: str, file: str) -> None:
    for k in d:
        if k not in allowed:
            raise SpecError("unknown key", file=file, key=f"{key}.{k}", value=k, allowed=", ".join(allowed),
                            fix=suggest(str(k), allowed) or f"remove `{k}`")


def _choice(d: dict[str, Any], k: str, choices: tuple[str, ...], default: str, key: str, file: str) -> str:
    v = d.get(k, default)
    if v not in choices:
        raise SpecError(f"bad value for `{k}`", file=file, key=f"{key}.{k}", value=v,
                        allowed="one of " + ", ".join(choices), fix=suggest(str(v), choices) or f"the default is {default!r}")
    return str(v)


def parse_components(v: Any, file: str) -> tuple[dict[str, m.Component], str, str]:
    """The ``source`` section: components, the missing-component policy, the error policy."""
    src = _mapping(v, "source", file, "{components: {image: {ext: jpg, kind: image}}}")
    _no_unknown(src, ("components", "missing", "on_error", "check_seconds"), "source", file)
    comps_raw = _mapping(src.get("components", DEFAULT_COMPONENTS), "source.components", file,
                         "{image: {ext: jpg, kind: image}}")
    if not comps_raw:
        raise SpecError("no components", file=file, key="source.components", fix="declare at least one component")
    comps = {}
    for name, c in comps_raw.items():
        key = f"source.components.{name}"
        c = _mapping(c, key, file, "{ext: jpg, kind: image}")
        _no_unknown(c, ("ext", "kind"), key, file)
        kind = _choice(c, "kind", m.COMPONENT_KINDS, "bytes", key, file)
        ext = c.get("ext", name)
        if not isinstance(ext, str) or not ext or " " in ext:
            raise SpecError("bad extension list", file=file, key=f"{key}.ext", value=ext,
                            allowed="extensions separated by ';' (e.g. 'jpg;jpeg;png')")
        comps[str(name)] = m.Component(str(name), ext.lower().lstrip("."), kind)  # type: ignore[arg-type]
    missing = _choice(src, "missing", m.MISSING_POLICIES, "error", "source", file)
    on_error = _choice(src, "on_error", m.ON_ERROR_POLICIES, "raise", "source", file)
    return comps, missing, on_error


CHECK_SECONDS_RANGE = (0.05, 600.0)


def parse_check_seconds(v: Any, file: str) -> float:
    """``source.check_seconds``: the time limit of one image check (a number of seconds)."""
    src = _mapping(v, "source", file, "{check_seconds: 2}")
    value = src.get("check_seconds", m.CHECK_SECONDS)
    lo, hi = CHECK_SECONDS_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise SpecError("bad value for `check_seconds`", file=file, key="source.check_seconds", value=value,
                        allowed=f"a number of seconds from {lo:g} to {hi:g}",
                        fix=f"the default is {m.CHECK_SECONDS:g}; raise it when large images (tens of megapixels) are "
                            "reported as taking longer to check")
    return float(value)


def parse_fields(v: Any, comps: dict[str, m.Component], file: str) -> dict[str, m.FieldPipeline]:
    """The ``pipeline`` section: one op list per output field, each checked end to end."""
    from feedfast.spec.load import op_entry

    pipes = _mapping(v, "pipeline", file, "{image: [decode, ...]}")
    if not pipes:
        raise SpecError("no pipeline", file=file, key="pipeline", fix="add e.g. `pipeline: {image: [decode, ...]}`")
    fields = {}
    for name, body in pipes.items():
        key = f"pipeline.{name}"
        source, ops_raw = str(name), body
        if isinstance(body, dict):
            _no_unknown(body, ("from", "ops"), key, file)
            source, ops_raw = str(body.get("from", name)), body.get("ops")
            key_ops = f"{key}.ops"
        else:
            key_ops = key
        if source not in comps:
            raise SpecError("the field reads a component that is not declared", file=file, key=f"{key}.from",
                            value=source, allowed=", ".join(comps), fix=suggest(source, list(comps)) or
                            "declare it under source.components or set `from:`")
        if not isinstance(ops_raw, list) or not ops_raw:
            raise SpecError("a field pipeline must be a non-empty list of ops", file=file, key=key_ops,
                            value=ops_raw, fix="e.g. `[decode, {resize: {size: 256}}]`; use `bytes` for raw data")
        ops = tuple(m.OpCall(*op_entry(e, f"{key_ops}[{i}]", file), key=f"{key_ops}[{i}]") for i, e in enumerate(ops_raw))
        field = m.FieldPipeline(str(name), source, ops, key)
        infer_field(field, comps[source], file)
        fields[str(name)] = field
    return fields


def source_signature(comp: m.Component) -> Signature:
    """The signature of a component's raw bytes as the reader yields them."""
    return Signature("encoded" if comp.kind == "image" else "bytes", (None,), "uint8", "", "cpu")


def infer_field(field: m.FieldPipeline, comp: m.Component, file: str) -> list[Signature]:
    """Each op's output signature along a field; a SpecError at the first impossible step."""
    sig, sigs = source_signature(comp), []
    for call in field.ops:
        op = OPS[call.op]
        if sig.device == "host" and not op.host:
            raise SpecError(f"`{call.op}` cannot follow a host op", file=file, key=call.key, value=call.op,
                            fix="image ops come before `normalize`/generic ops")
        try:
            sig = op.infer(sig, call.params)
        except SignatureError as exc:
            raise SpecError(f"impossible chain: {exc}", file=file, key=call.key, value=call.op) from None
        sigs.append(sig)
    if sig.kind in ("image", "tensor") and None in sig.shape:
        raise SpecError("images in a batch must share one size", file=file, key=field.key,
                        value=sig.describe(), fix="end the field with a fixed-size op (center_crop, "
                        "random_resized_crop, or resize with [h, w])")
    if sig.kind == "encoded":
        raise SpecError("the field yields undecoded image bytes", file=file, key=field.key,
                        fix="add `decode`, or use the `bytes` op to get raw bytes on purpose")
    return sigs


def parse_outputs(v: Any, fields: dict[str, m.FieldPipeline], file: str) -> tuple[tuple[str, ...], str]:
    """The ``outputs`` section: a list (tuple batches) or a mapping (dict batches)."""
    if v is None:
        return tuple(fields), "tuple"
    names = list(v) if isinstance(v, (list, dict)) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise SpecError("outputs must be a non-empty list of field names", file=file, key="outputs",
                        value=v, allowed=", ".join(fields))
    for i, n in enumerate(names):
        if n not in fields:
            raise SpecError("output names a field that the pipeline does not define", file=file,
                            key=f"outputs[{i}]", value=n, allowed=", ".join(fields),
                            fix=suggest(n, list(fields)) or f"add `pipeline.{n}`")
    if len(set(names)) != len(names):
        raise SpecError("an output is listed twice", file=file, key="outputs", value=names)
    return tuple(names), "dict" if isinstance(v, dict) else "tuple"


def parse_batch(v: Any, file: str) -> tuple[int, m.LastBatch]:
    """The ``batch`` section: size and last-batch policy."""
    b = _mapping(v, "batch", file, "{size: 64, last_batch: partial}")
    _no_unknown(b, ("size", "last_batch", "mix"), "batch", file)
    size = b.get("size", 64)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise SpecError("bad batch size", file=file, key="batch.size", value=size, allowed="an integer >= 1")
    last = _choice(b, "last_batch", m.LAST_BATCH_POLICIES, "partial", "batch", file)
    return size, last  # type: ignore[return-value]


def parse_shuffle(v: Any, file: str) -> tuple[int, bool, int, int]:
    """The ``shuffle`` section: sample buffer size, per-epoch shard order, and the block shuffle's
    ``block`` and ``window`` (samples; see :func:`feedfast.order.block.block_order`)."""
    block_default, window_default = m.SHUFFLE_BLOCK, m.SHUFFLE_WINDOW
    if isinstance(v, bool):
        return (1024 if v else 0), v, block_default, window_default
    s = _mapping(v, "shuffle", file, f"{{buffer: 1024, shards: true, block: {block_default}, window: {window_default}}}")
    _no_unknown(s, ("buffer", "shards", "block", "window", "repeats"), "shuffle", file)
    buf, shards = s.get("buffer", 0), s.get("shards", False)
    if not isinstance(buf, int) or isinstance(buf, bool) or buf < 0:
        raise SpecError("bad shuffle buffer", file=file, key="shuffle.buffer", value=buf, allowed="an integer >= 0")
    if not isinstance(shards, bool):
        raise SpecError("bad value", file=file, key="shuffle.shards", value=shards, allowed="true or false")
    sizes = {}
    for key, default, what in (("window", window_default, "consecutive samples of a shard read at once"),
                               ("block", block_default, "samples each window is spread over (held in memory)")):
        n = s.get(key, default)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise SpecError(f"bad block-shuffle size: {what}", file=file, key=f"shuffle.{key}", value=n,
                            allowed="an integer >= 1", fix=f"remove the key for the default, {default}")
        sizes[key] = n
    if sizes["window"] > sizes["block"]:
        raise SpecError("the window is larger than the block: windows would not be interleaved", file=file,
                        key="shuffle.window", value=sizes["window"], allowed=f"an integer <= shuffle.block ({sizes['block']})",
                        fix=f"a window of a few dozen samples (the default is {window_default}) and a block "
                            "hundreds of times larger mix hundreds of shards")
    return buf, shards, sizes["block"], sizes["window"]


MAX_REPEATS = 64


def parse_repeats(v: Any, file: str) -> int:
    """``shuffle.repeats``: repeated augmentation, each sample this many times an epoch (1: off; see
    :mod:`feedfast.order.repeats`). It needs a shuffled epoch (the copies spread over the epoch's order)."""
    if not isinstance(v, dict) or "repeats" not in v:
        return 1
    n = v["repeats"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REPEATS:
        raise SpecError("bad value for `repeats`: copies of each sample per epoch", file=file, key="shuffle.repeats",
                        value=n, allowed=f"an integer from 1 to {MAX_REPEATS}",
                        fix="3 is DeiT's repeated augmentation; 1 (or no key) turns it off")
    if n > 1 and not (v.get("buffer", 0) or v.get("shards", False)):
        raise SpecError("repeated augmentation needs a shuffled epoch", file=file, key="shuffle.repeats", value=n,
                        fix="add `shards: true` (or a `buffer`) to the shuffle section, or pass shuffle=True")
    return n


def parse_decoder(v: Any, file: str) -> m.DecoderSettings:
    """The ``decoder`` section: nvJPEG settings of GPU decoding; a key left out keeps NVIDIA's value."""
    d = _mapping(v, "decoder", file, "{hw_decoder_load: 0.65}")
    _no_unknown(d, tuple(p.name for p in m.DECODER_PARAMS), "decoder", file)
    values = {}
    for p in m.DECODER_PARAMS:
        if p.name not in d:
            continue
        try:
            values[p.name] = coerce(p, d[p.name])
        except ValueError:
            raise SpecError(f"bad value for `{p.name}` ({p.doc})", file=file, key=f"decoder.{p.name}",
                            value=d[p.name], allowed=p.allowed(),
                            fix=f"remove the key for the default, {p.default!r}") from None
    return m.DecoderSettings(**values)


def _count(v: Any, key: str, file: str, low: int, high: int) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise SpecError("bad value", file=file, key=key, value=v, allowed=f"an integer from {low} to {high}",
                        fix="remove the key for the default")
    return v


def parse_loader(v: Any, file: str) -> LoaderSection:
    """The ``loader`` section (every key optional)."""
    d = _mapping(v, "loader", file, "{threads: 2, prefetch: 2}")
    _no_unknown(d, ("threads", "prefetch", "backend"), "loader", file)
    backend = d.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise SpecError("bad value", file=file, key="loader.backend", value=backend,
                        allowed="one of " + ", ".join(BACKENDS), fix="remove the key for 'auto'")
    return LoaderSection(threads=_count(d.get("threads"), "loader.threads", file, 1, 1024),
                          prefetch=_count(d.get("prefetch"), "loader.prefetch", file, 1, 64), backend=backend)


def parse_tune(v: Any, file: str) -> TuneSettings:
    """The ``tune`` section (``enabled`` false and ``budget`` 0.1 by default)."""
    d = _mapping(v, "tune", file, "{enabled: true, budget: 0.1}")
    _no_unknown(d, ("enabled", "budget"), "tune", file)
    enabled = d.get("enabled", False)
    if not isinstance(enabled, bool):
        raise SpecError("bad value", file=file, key="tune.enabled", value=enabled, allowed="true or false")
    budget = d.get("budget", 0.1)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1:
        raise SpecError("bad value", file=file, key="tune.budget", value=budget,
                        allowed="a share of the first epoch in (0, 1]", fix="e.g. 0.1 (the default)")
    return TuneSettings(enabled=enabled, budget=float(budget))
