"""Spec to plan: ``build_plan`` lowers each field pipeline to nodes, merges identical deterministic steps
(so one decode can feed several views), then runs the passes of :mod:`feedfast.compile.passes`:
placement, cheap transfer, fusion.
"""

from __future__ import annotations

from feedfast.compile import passes
from feedfast.compile.plan import Node, Plan, resolve_placement
from feedfast.ops.registry import OPS
from feedfast.spec.model import Spec
from feedfast.spec.sections import infer_field, source_signature


def lower(spec: Spec) -> Plan:
    """Lower a spec to nodes (all on the CPU), sharing identical deterministic steps."""
    nodes: list[Node] = []
    used = [c for c in spec.components if any(f.source == c for f in spec.fields.values())]
    for name in used:
        comp = spec.components[name]
        nodes.append(Node(len(nodes), "read", {"component": name, "ext": comp.ext}, (),
                          source_signature(comp), dali_op="readers.webdataset", key=f"source.components.{name}"))
    memo: dict[tuple[str, str, int], int] = {}
    outputs = {}
    for f in spec.fields.values():
        sigs = infer_field(f, spec.components[f.source], spec.file)
        cur = used.index(f.source)
        for call, sig in zip(f.ops, sigs):
            op = OPS[call.op]
            memo_key = (call.op, repr(sorted(call.params.items())) + call.device, cur)
            if not op.random and memo_key in memo:
                cur = memo[memo_key]
                continue
            node = Node(len(nodes), call.op, dict(call.params), (cur,), sig,
                        device="host" if op.host else "cpu", dali_op=op.dali_name, key=call.key,
                        override=call.device)
            nodes.append(node)
            memo[memo_key] = cur = node.id
        outputs[f.name] = cur
    return Plan(spec, nodes, used, {o: outputs[o] for o in spec.outputs}, "cpu")


def build_plan(spec: Spec, *, device: str | None = None, consumer: str = "cpu", fuse: bool = True) -> Plan:
    """Compile a spec into a checked, placed and optimized plan.

    Args:
        spec: a validated spec.
        device: ``auto``, ``cpu`` or ``gpu``; defaults to the spec's ``device``.
        consumer: where the batches go (``cpu`` or ``cuda``); a CPU pipeline feeding
            ``cuda`` copies uint8 and normalizes on the device (cheap transfer).
        fuse: apply the fusion pass.
    """
    plan = lower(spec)
    plan.consumer = consumer
    passes.place(plan, resolve_placement(device or spec.device))
    passes.cheap_transfer(plan, consumer)
    if fuse:
        passes.fuse(plan)
    return plan
