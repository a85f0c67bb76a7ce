"""The spec reference, generated from the op registry so docs and validation cannot drift.

``python -m feedfast.spec.reference > docs/spec-reference.md`` rewrites the page; a test
checks that the committed page equals this output.
"""

from __future__ import annotations

from feedfast.ops.base import REQUIRED, OpDef, Param
from feedfast.ops.registry import OPS
from feedfast.spec import model as m

HEADER = """# Spec reference

Generated from the op registry (`feedfast/ops/registry.py`) by
`python -m feedfast.spec.reference`; do not edit by hand.

## Top-level keys

| key | allowed | default |
|---|---|---|
| `version` | `1` | `1` |
| `name` | a string | the file's name |
| `source.components.NAME` | `{{ext: "jpg;jpeg", kind: ...}}`, kind one of {kinds} | `image` (jpg;jpeg;png) and `label` (cls) |
| `source.missing` | {missing} | `error` |
| `source.on_error` | {on_error} | `raise` |
| `pipeline.FIELD` | a list of ops, or `{{from: COMPONENT, ops: [...]}}` | (required) |
| `outputs` | a list of fields (tuple batches) or a mapping (dict batches) | every field, in order |
| `batch.size` | an integer >= 1 | `64` |
| `batch.last_batch` | {last} | `partial` |
| `shuffle.buffer` | an integer >= 0 (samples) | `0` |
| `shuffle.shards` | true or false | `false` |
| `device` | {devices} | `auto` |
| `seed` | an integer | `0` |

Every op also takes `device: auto | cpu | gpu`, overriding the pipeline's placement for it.

## Ops
"""


def _default(p: Param) -> str:
    if p.default is REQUIRED:
        return "(required)"
    v = list(p.default) if isinstance(p.default, tuple) else p.default
    return f"`{v!r}`" if not isinstance(v, list) else "`[" + ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) + "]`"


def render_op(op: OpDef) -> str:
    """One op's section: what it does, where it runs, its parameters."""
    where = "host, after the DALI graph" if op.host else ", ".join(op.devices)
    lines = [f"### `{op.name}`", "", f"{op.doc}.", "", f"DALI: `{op.dali_name}`; runs on: {where}; "
             f"random: {'yes' if op.random else 'no'}; PIL backend: {'yes' if op.pil else 'no'}.", ""]
    if op.params:
        lines += ["| parameter | meaning | allowed | default |", "|---|---|---|---|"]
        lines += [f"| `{p.name}` | {p.doc} | {p.allowed()} | {_default(p)} |" for p in op.params]
    else:
        lines.append("No parameters.")
    return "\n".join(lines) + "\n"


def render_reference() -> str:
    """The whole reference page as Markdown."""
    quote = lambda xs: ", ".join(f"`{x}`" for x in xs)  # noqa: E731
    head = HEADER.format(kinds=quote(m.COMPONENT_KINDS), missing=quote(m.MISSING_POLICIES),
                         on_error=quote(m.ON_ERROR_POLICIES), last=quote(m.LAST_BATCH_POLICIES), devices=quote(m.DEVICES))
    return head + "\n" + "\n".join(render_op(op) for op in OPS.values())


if __name__ == "__main__":
    print(render_reference(), end="")
