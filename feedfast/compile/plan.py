"""The plan: a small IR of nodes with declared signatures, built from a Spec.

What a plan is; :mod:`feedfast.compile.build` builds one from a spec and
:mod:`feedfast.compile.passes` rewrites it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from feedfast.ops.base import Signature
from feedfast.spec.model import Spec

Placement = Literal["cpu", "gpu"]


@dataclass
class Node:
    """One step of the plan.

    Attributes:
        id: position in ``Plan.nodes`` (inputs always come earlier).
        op: the feedfast op name, ``read`` for a reader output, or ``a+b`` once fused.
        params: the op's parameters (for a fused node, by op name).
        inputs: ids of input nodes.
        sig: the output signature.
        device: ``cpu``, ``gpu``, ``mixed`` (GPU decode fed from the CPU) or ``host``.
        dali_op: DALI's operator name(s), for ``feedfast plan``.
        deferred: the op runs in torch on the consumer's device after the copy.
    """

    id: int
    op: str
    params: dict[str, Any]
    inputs: tuple[int, ...]
    sig: Signature
    device: str = "cpu"
    dali_op: str = ""
    deferred: bool = False
    key: str = ""
    override: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        """The node as JSON-safe data."""
        return {
            "id": self.id, "op": self.dali_op, "feedfast_op": self.op, "device": self.device,
            "inputs": list(self.inputs), "signature": self.sig.describe(), "dtype": self.sig.dtype,
            "layout": self.sig.layout, "shape": list(self.sig.shape), "deferred": self.deferred,
            "params": _jsonable(self.params), "spec_key": self.key,
        }


@dataclass
class Plan:
    """Nodes in topological order, the reader's components and the output fields."""

    spec: Spec
    nodes: list[Node]
    components: list[str]
    outputs: dict[str, int]
    placement: Placement
    consumer: str = "cpu"
    passes: list[str] = field(default_factory=list)

    def component_exts(self) -> list[frozenset[str]]:
        """Each reader component's file extensions, lower-cased, in the reader's output order."""
        return [frozenset(self.spec.components[c].ext.lower().split(";")) for c in self.components]

    def deferred_outputs(self) -> dict[str, dict[str, Any]]:
        """Output fields whose ``normalize`` runs on the consumer's device after the copy, with its parameters."""
        return {name: self.nodes[nid].params for name, nid in self.outputs.items() if self.nodes[nid].deferred}

    def consumers(self, node_id: int) -> list[Node]:
        """The nodes that read ``node_id``'s output."""
        return [n for n in self.nodes if node_id in n.inputs]

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-safe data (``feedfast plan --json``); a ``mixed`` decode shows its nvJPEG settings."""
        nodes = []
        for n in self.nodes:
            node = n.to_dict()
            if decoder := self.spec.decoder.args_for(n.device):
                node["decoder"] = decoder
            nodes.append(node)
        return {
            "spec": self.spec.name, "placement": self.placement, "consumer": self.consumer,
            "components": self.components, "outputs": dict(self.outputs),
            "passes": list(self.passes), "nodes": nodes,
            **({"mix": self.spec.mix.to_dict()} if self.spec.mix is not None else {}),
            **({"repeats": self.spec.repeats} if self.spec.repeats > 1 else {}),
        }


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def resolve_placement(requested: str) -> Placement:
    """``auto`` becomes ``gpu`` when CUDA is usable, else ``cpu``."""
    if requested in ("cpu", "gpu"):
        return requested  # type: ignore[return-value]
    from feedfast._env import cuda_available

    return "gpu" if cuda_available() else "cpu"
