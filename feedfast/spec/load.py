"""Loading a spec from YAML, TOML, JSON or a dict, with ``--set`` overrides, into a Spec."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from feedfast.errors import SpecError
from feedfast.ops.registry import OPS, suggest
from feedfast.spec import model as m
from feedfast.spec.params import check_params
from feedfast.spec.shipped import resolve_spec_path
from feedfast.spec.yamlfile import load_yaml

TOP_KEYS = ("version", "name", "source", "pipeline", "outputs", "batch", "shuffle", "device", "seed", "decoder",
            "loader", "tune")
SpecLike = "str | os.PathLike[str] | Mapping[str, Any] | m.Spec"


def load_spec(spec: Any, overrides: Sequence[str] = ()) -> m.Spec:
    """Load and validate a spec.

    Args:
        spec: a path to a ``.yaml``/``.yml``/``.toml``/``.json`` file, the name of a shipped
            pipeline (``"imagenet-train"``; a path that exists wins over a name; see
            :mod:`feedfast.spec.shipped`), a mapping, or a Spec.
        overrides: ``key.path=value`` strings, e.g. ``pipeline.image[1].size=192``; the
            value is read as YAML.

    Raises:
        SpecError: the file is missing (the message lists the shipped names) or unparsable,
            or the spec is invalid.
    """
    if isinstance(spec, m.Spec) and not overrides:
        return spec
    if isinstance(spec, m.Spec):
        raw, file = spec.to_dict(), spec.file
    elif isinstance(spec, Mapping):
        raw, file = copy.deepcopy(dict(spec)), "<dict>"
    elif isinstance(spec, (str, os.PathLike)):
        path = resolve_spec_path(spec)
        raw, file = read_file(path), (str(spec) if path == Path(spec) else str(path))
    else:
        raise SpecError("a spec must be a file path, a mapping or a Spec", value=type(spec).__name__)
    for item in overrides:
        apply_override(raw, item, file=file)
    return build_spec(raw, file=file)


def read_file(path: Path) -> dict[str, Any]:
    """Parse a spec file by its extension; errors name the file."""
    if not path.is_file():
        raise SpecError("spec file not found" if not path.exists() else "spec path is not a file",
                        file=str(path),
                        fix="give the path of a .yaml, .toml or .json spec, or a shipped pipeline's name (imagenet-train)")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            data = load_yaml(text, file=str(path))
    except SpecError:
        raise
    except Exception as exc:  # each parser has its own error family; all mean "unparsable"
        raise SpecError(f"cannot parse the file: {exc}".replace("\n", " "), file=str(path)) from exc
    if not isinstance(data, dict):
        raise SpecError("the top level must be a mapping", file=str(path), value=type(data).__name__,
                        fix="start the file with keys such as `pipeline:` and `outputs:`")
    return data


_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def apply_override(raw: dict[str, Any], item: str, *, file: str) -> None:
    """Apply one ``a.b[2].c=value`` override to raw spec data in place.

    Inside a pipeline entry written as ``- op: {params}``, a key that is not the op's name
    addresses a parameter: ``pipeline.image[1].size=192``.
    """
    import yaml

    if "=" not in item:
        raise SpecError("an override must look like key.path=value", file=file, value=item,
                        fix="e.g. --set pipeline.image[1].size=192")
    path, text = item.split("=", 1)
    steps = [int(i) if i else k for k, i in _STEP.findall(path.strip())]
    if not steps:
        raise SpecError("empty key path in override", file=file, value=item)
    value = yaml.safe_load(text)
    node: Any = raw
    for step in steps[:-1]:
        node = _descend(node, step, path, file)
    _assign(node, steps[-1], value, path, file)


def _descend(node: Any, step: str | int, path: str, file: str) -> Any:
    node = _op_params(node, step)
    if isinstance(step, int):
        if not isinstance(node, list) or step >= len(node):
            raise SpecError("override index out of range", file=file, key=path, value=step)
        if isinstance(node[step], str) and node[step] in OPS:
            node[step] = {node[step]: {}}  # `- decode` gains parameters: `- decode: {...}`
        return node[step]
    if not isinstance(node, dict):
        raise SpecError("override path goes through a value that is not a mapping", file=file, key=path)
    return node.setdefault(step, {})


def _op_params(node: Any, step: str | int) -> Any:
    """Inside ``{op: params}``, a key other than the op name addresses the params."""
    if isinstance(node, dict) and len(node) == 1 and isinstance(step, str):
        (name, params), = node.items()
        if name in OPS and step != name:
            if params is None:
                node[name] = params = {}
            return params
    return node


def _assign(node: Any, step: str | int, value: Any, path: str, file: str) -> None:
    node = _op_params(node, step)
    if isinstance(step, int):
        if not isinstance(node, list) or step >= len(node):
            raise SpecError("override index out of range", file=file, key=path, value=step)
        node[step] = value
    elif isinstance(node, dict):
        node[step] = value
    else:
        raise SpecError("override path ends inside a value that is not a mapping", file=file, key=path)


MAX_SPEC_VALUES = 100_000  # values in a spec once YAML aliases are expanded (the shipped ones hold about 100)
MAX_SPEC_CHARS = 1_000_000  # characters of its strings, likewise


def check_expanded_size(raw: Any, *, file: str) -> None:
    """Refuse spec data too large once its aliases are expanded, before anything formats it.

    YAML aliases (``&a`` and ``*a``) share one object however often they are used, so a few
    hundred bytes can expand to billions of values (an "alias bomb"), and a loop (``&a [*a]``)
    to infinitely many; an error message that printed such a value would never finish. The
    walk stops at the first value past :data:`MAX_SPEC_VALUES` or character past
    :data:`MAX_SPEC_CHARS`, so it costs at most that much.

    Raises:
        SpecError: the data is larger; names the top-level key it was found under.
    """
    values, chars = 0, 0
    stack: list[tuple[Any, str]] = [(v, str(k)[:80]) for k, v in raw.items()] if isinstance(raw, dict) else [(raw, "")]
    while stack:
        node, top = stack.pop()
        values += 1
        if isinstance(node, (str, bytes)):
            chars += len(node)
        elif isinstance(node, dict):
            stack.extend((k, top) for k in node)
            stack.extend((v, top) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, top) for v in node)
        if values > MAX_SPEC_VALUES or chars > MAX_SPEC_CHARS:
            raise SpecError(f"the spec is too large once its YAML aliases are expanded: more than {MAX_SPEC_VALUES:,} "
                            f"values or {MAX_SPEC_CHARS:,} characters", file=file, key=top or None,
                            fix="write the values out, or use aliases (`*name`) only for small repeated parts")


def build_spec(raw: dict[str, Any], *, file: str = "<dict>") -> m.Spec:
    """Validate raw spec data and build the typed Spec (refused first when too large: :func:`check_expanded_size`)."""
    from feedfast.spec.sections import (
        parse_batch,
        parse_check_seconds,
        parse_components,
        parse_decoder,
        parse_fields,
        parse_loader,
        parse_outputs,
        parse_repeats,
        parse_scalar,
        parse_shuffle,
        parse_tune,
    )

    check_expanded_size(raw, file=file)
    for key in raw:
        if key not in TOP_KEYS:
            raise SpecError("unknown key", file=file, key=str(key), value=key, allowed=", ".join(TOP_KEYS),
                            fix=suggest(str(key), TOP_KEYS) or f"remove `{key}`")
    version = parse_scalar(raw, "version", int, 1, file, choices=(1,))
    components, missing, on_error = parse_components(raw.get("source"), file)
    fields = parse_fields(raw.get("pipeline"), components, file)
    outputs, form = parse_outputs(raw.get("outputs"), fields, file)
    size, last = parse_batch(raw.get("batch"), file)
    from feedfast.spec.batchmix_section import parse_mix

    batch_raw = raw.get("batch")
    mix = parse_mix(batch_raw.get("mix") if isinstance(batch_raw, dict) else None, fields, components, outputs, file)
    buffer, shards, block, window = parse_shuffle(raw.get("shuffle"), file)
    return m.Spec(
        name=parse_scalar(raw, "name", str, Path(file).stem if file != "<dict>" else "spec", file),
        components=components, fields=fields, outputs=outputs, output_form="dict" if form == "dict" else "tuple",
        missing=missing, on_error=on_error, check_seconds=parse_check_seconds(raw.get("source"), file),
        batch_size=size, last_batch=last, mix=mix,
        device=parse_scalar(raw, "device", str, "auto", file, choices=m.DEVICES),
        seed=parse_scalar(raw, "seed", int, 0, file), shuffle_buffer=buffer,
        shuffle_shards=shards, shuffle_block=block, shuffle_window=window, repeats=parse_repeats(raw.get("shuffle"), file),
        decoder=parse_decoder(raw.get("decoder"), file), version=version, file=file,
        loader=parse_loader(raw.get("loader"), file), tune=parse_tune(raw.get("tune"), file),
    )


def op_entry(entry: Any, key: str, file: str) -> tuple[str, Any, str]:
    """Split a pipeline entry (``"decode"`` or ``{"resize": {...}}``) into name, params, device.

    The reserved parameter ``device`` (``auto``, ``cpu`` or ``gpu``) overrides placement.
    """
    if isinstance(entry, str):
        name, params = entry, None
    elif isinstance(entry, dict) and len(entry) == 1:
        (name, params), = entry.items()
    else:
        raise SpecError("a pipeline step must be an op name or a one-key mapping {op: {params}}",
                        file=file, key=key, value=entry, fix="e.g. `- resize: {size: 256}`")
    if name not in OPS:
        raise SpecError("unknown op", file=file, key=key, value=name, allowed=", ".join(OPS),
                        fix=suggest(str(name)) or "see `feedfast plan --ops` for the list")
    device = "auto"
    if isinstance(params, dict) and "device" in params:
        params = dict(params)
        device = params.pop("device")
        if device not in ("auto", "cpu", "gpu"):
            raise SpecError("bad placement override", file=file, key=f"{key}.device", value=device,
                            allowed="one of 'auto', 'cpu', 'gpu'", fix="omit `device` to follow the spec's placement")
        if OPS[str(name)].host and device == "gpu":
            raise SpecError(f"`{name}` runs on the host and cannot be placed on the GPU", file=file,
                            key=f"{key}.device", value=device, fix="remove `device: gpu`")
    return str(name), check_params(OPS[str(name)], params, file=file, key=key), device
