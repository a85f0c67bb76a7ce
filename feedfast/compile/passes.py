"""Passes over the plan: placement, cheap transfer, fusion.

- placement: on ``gpu``, decode becomes DALI's ``mixed`` nvJPEG decoder and every image op
  after it runs on the GPU; host ops stay on the host.
- cheap transfer: a CPU pipeline feeding a CUDA consumer ends its image fields in uint8;
  the last ``normalize`` runs in torch on the device after the copy (4x fewer bytes).
- fusion: ``decode`` -> ``random_resized_crop`` becomes one region-of-interest decode
  (``decoders.image_random_crop``) plus a resize; a horizontal ``flip`` and a
  ``center_crop`` right before ``normalize`` fold into one ``crop_mirror_normalize``.
"""

from __future__ import annotations

from feedfast.compile.plan import Node, Plan
from feedfast.errors import SpecError
from feedfast.ops.registry import OPS


def forced_onto_gpu(plan: Plan) -> list[str]:
    """The key paths (``pipeline.image[2]``) of the ops a spec forces onto the GPU (``device: gpu``).

    Such an op makes the whole pipeline GPU-placed whatever placement was asked (see
    :func:`place`), so whoever resolves where the pipeline runs and DALI's ``device_id``
    must ask this first: a pipeline with GPU operators built with ``device_id=None`` is
    limited to CPU operators by DALI.
    """
    return [n.key for n in plan.nodes if n.op != "read" and not OPS[n.op].host and n.override == "gpu"]


def place(plan: Plan, placement: str) -> None:
    """Assign each node a device for ``placement`` (``cpu`` or ``gpu``), honouring per-op overrides.

    Data moves from the CPU to the GPU once: an op forced onto the CPU after one on the GPU
    is a SpecError. An op forced onto the GPU makes the plan GPU-placed under ``cpu`` too
    (``plan.placement`` says ``gpu``); the loader resolves its delivery and DALI's
    ``device_id`` for that placement (:func:`forced_onto_gpu`), never for the one asked.
    """
    plan.placement = placement  # type: ignore[assignment]
    for n in plan.nodes:
        if n.op == "read" or OPS[n.op].host:
            continue
        src = plan.nodes[n.inputs[0]]
        want = placement if n.override == "auto" else n.override
        if n.override == "auto" and src.device in ("gpu", "mixed"):
            want = "gpu"  # data already on the GPU stays there
        if want == "cpu" and src.device in ("gpu", "mixed"):
            raise SpecError("an op cannot run on the CPU after one on the GPU (data moves to the GPU once)",
                            file=plan.spec.file, key=f"{n.key}.device", value=want,
                            fix="place the earlier ops on the CPU too, or this one on the GPU")
        if want == "gpu" and placement == "cpu" and n.override == "gpu":
            plan.placement = "gpu"  # a GPU op needs a GPU pipeline
        if want == "gpu":
            n.device = "mixed" if "mixed" in OPS[n.op].devices else "gpu"  # decode's GPU form is nvJPEG's
        else:
            n.device = "cpu"
        n.sig = n.sig.with_(device="gpu" if n.device in ("gpu", "mixed") else "cpu")
    plan.passes.append(f"placement:{plan.placement}")


def cheap_transfer(plan: Plan, consumer: str) -> None:
    """Defer each output ``normalize`` to the consumer's device when the pipeline is on CPU."""
    if consumer != "cuda" or plan.placement != "cpu":
        return
    for field, nid in plan.outputs.items():
        n = plan.nodes[nid]
        if n.op == "normalize" and len(plan.consumers(nid)) == 0:
            n.deferred = True
            n.device = "cuda"
            n.dali_op = "(torch) normalize"
            plan.passes.append(f"cheap_transfer:{field}")


def _only_child(plan: Plan, parent: Node, child: Node) -> bool:
    """``child`` is ``parent``'s only reader, on the same side of the PCIe bus."""
    same_side = (parent.device in ("gpu", "mixed")) == (child.device in ("gpu", "mixed"))
    return (same_side and [c.id for c in plan.consumers(parent.id)] == [child.id]
            and parent.id not in plan.outputs.values())


def _decodes(op: str) -> bool:
    """Whether the op turns encoded bytes into an image (what a region-of-interest decode fuses with)."""
    form = OPS[op].threaded if op in OPS else None
    return form is not None and form.role == "decode"


def fuse(plan: Plan) -> None:
    """Apply the fusions each op declares, rewriting nodes in place and dropping the absorbed ones.

    An op with ``dali_after_decode`` right after the decode it alone reads becomes one fused
    node (``decode+random_resized_crop``); an op with ``absorbs`` takes the ops named there that
    come right before it, nearest first, where each one's ``folds`` accepts its parameters.
    """
    absorbed: set[int] = set()
    for n in plan.nodes:
        op = OPS.get(n.op)
        if op is None or n.deferred:
            continue
        if op.dali_after_decode is not None:
            src = plan.nodes[n.inputs[0]]
            if _decodes(src.op) and _only_child(plan, src, n):
                n.params = {src.op: src.params, n.op: n.params}
                n.op, n.inputs, n.device = f"{src.op}+{n.op}", src.inputs, src.device
                n.dali_op = op.dali_after_decode.name
                absorbed.add(src.id)
                plan.passes.append(f"fuse:{n.op}@{n.key}")
        elif op.absorbs:
            _absorb(plan, n, absorbed)
    _drop(plan, absorbed)


def _absorb(plan: Plan, n: Node, absorbed: set[int]) -> None:
    ops = [n.op]
    params = {n.op: n.params}
    for name in OPS[n.op].absorbs:
        src = plan.nodes[n.inputs[0]]
        folds = OPS[name].folds
        if src.op == name and folds is not None and folds(src.params) and _only_child(plan, src, n):
            params[name] = src.params
            ops.insert(0, name)
            absorbed.add(src.id)
            n.inputs = src.inputs
    if len(ops) > 1:
        n.op = "+".join(ops)
        n.params = params
        plan.passes.append(f"fuse:{n.op}@{n.key}")


def _drop(plan: Plan, absorbed: set[int]) -> None:
    """Remove absorbed nodes and renumber ids."""
    keep = [n for n in plan.nodes if n.id not in absorbed]
    remap = {n.id: i for i, n in enumerate(keep)}
    for n in keep:
        n.id = remap[n.id]
        n.inputs = tuple(remap[i] for i in n.inputs)
    plan.nodes = keep
    plan.outputs = {k: remap[v] for k, v in plan.outputs.items()}
