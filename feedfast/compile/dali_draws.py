"""Which DALI nodes take their random draws as data: the crop window and the flips, fed per sample.

DALI's random operators draw from the pipeline's own generator, which runs on from batch to batch:
an epoch's crops then depend on every batch the pipeline ran before, not on (seed, epoch, sample).
feedfast's other backends draw each sample's crop and flips from the counter-based draws of
:mod:`feedfast.order.draws`, keyed by (seed, epoch, sample). Behind feedfast's feed, DALI is given
the same draws: the feed computes each sample's crop window and flips in C
(``feedfast._plan.plan_packed``, the threaded path's arithmetic) and hands them to DALI as more
outputs of its ``external_source``, which the decode (``decoders.image_slice``) and the flip (or the
``mirror`` of ``crop_mirror_normalize``) take as inputs. So ``threads``, ``pil`` and ``dali`` draw the same
crop boxes, an elastic resume gets the same augmentation, and no pipeline is rebuilt for an epoch.

An op takes its draws as data where it declares how (``OpDef.dali_draws``): ``window``, a crop of the
decoded image (``random_resized_crop`` right after ``decode``, fused with it or not); ``flips``, the
flags of a flip (folded into ``normalize`` or not). The image chain is walked from its decode while
no op draws but those fed; the first op that draws otherwise, and every op after it, keeps DALI's
generator, as does every op where the plan does not apply (a pipeline behind DALI's own reader, which
:mod:`feedfast.compile.dali` can still emit: the backend never builds one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from feedfast.compile.plan import Node, Plan
from feedfast.ops import threaded as th
from feedfast.ops.registry import OPS


@dataclass(frozen=True)
class FedDraws:
    """The draws a plan's DALI graph is fed.

    Attributes:
        component: the component the image chain decodes.
        program: float64 [ops, ``PLAN_SLOTS``]: the chain as ``_plan.c`` reads it (decode first).
        window: the node whose crop window is fed (anchor and shape, in pixels, x then y), or None.
        window_params: that op's parameters (for the Python walk of a sample the C plan cannot read).
        window_op: that op's name.
        flip: the node whose flips are fed (horizontal and vertical, int32 0 or 1), or None.
        flip_params: that flip's parameters.
        flip_op: that op's name.
        flip_vertical: whether the vertical flag is fed too (not to a flip folded into ``crop_mirror_normalize``,
            which mirrors horizontally only, and folds a flip only where it never flips vertically).
    """

    component: int
    program: np.ndarray
    window: int | None
    window_params: dict
    window_op: str
    flip: int | None
    flip_params: dict
    flip_op: str = ""
    flip_vertical: bool = True

    @property
    def outputs(self) -> int:
        """Outputs the feed adds after the components: anchor and shape for a window, horizontal and vertical."""
        return (2 if self.window is not None else 0) + (1 + self.flip_vertical if self.flip is not None else 0)

    def inputs(self, extra: list) -> dict[int, dict[str, object]]:
        """The fed DataNodes (``extra``: the outputs after the components) by the node that takes them."""
        fed: dict[int, dict[str, object]] = {}
        rest = list(extra)
        if self.window is not None:
            fed.setdefault(self.window, {}).update(anchor=rest.pop(0), shape=rest.pop(0))
        if self.flip is not None:
            fed.setdefault(self.flip, {}).update(horizontal=rest.pop(0))
            if self.flip_vertical:
                fed[self.flip]["vertical"] = rest.pop(0)
        return fed


def fed_draws(plan: Plan) -> FedDraws | None:
    """The draws the plan's DALI graph can be fed (see the module's docstring); None when no op takes them."""
    chains = [n for n in plan.nodes if _ops(n)[:1] == ["decode"] and plan.nodes[n.inputs[0]].op == "read"]
    if len(chains) != 1:  # a decode per image component: each chain would need its own draws
        return None
    node: Node | None = chains[0]
    decode = _params(node, "decode")  # type: ignore[arg-type]
    rows: list[list[float]] = [[th.PLAN_DECODE, float(decode["color"] == "gray"), 0.0]]
    window = flip = None
    window_params: dict = {}
    flip_params: dict = {}
    window_op = flip_op = ""
    first = True
    while node is not None:
        for op in _ops(node):
            if op == "decode":
                continue
            definition, params = OPS[op], _params(node, op)
            form = definition.threaded
            row = form.plan_row(params) if form is not None and form.plan_row is not None else None
            takes = definition.dali_draws
            if takes == "window" and first and row is not None and window is None:
                window, window_params, window_op = node.id, params, op
            elif takes == "flips" and row is not None and flip is None:
                flip, flip_params, flip_op = node.id, params, op
            elif definition.random:  # its draws would come between: this op and those after it keep DALI's
                return _made(plan, chains[0], rows, window, window_params, window_op, flip, flip_params, flip_op)
            first = False
            if row:
                rows.append(row)
        consumers = plan.consumers(node.id)
        node = consumers[0] if len(consumers) == 1 and not consumers[0].deferred else None
    return _made(plan, chains[0], rows, window, window_params, window_op, flip, flip_params, flip_op)


def _made(plan: Plan, decode: Node, rows: list[list[float]], window: int | None, window_params: dict, window_op: str,
          flip: int | None, flip_params: dict, flip_op: str) -> FedDraws | None:
    if window is None and flip is None:
        return None
    return FedDraws(decode.inputs[0], th.plan_program(rows), window, window_params, window_op, flip, flip_params, flip_op,
                    flip_vertical=flip_op == plan.nodes[flip].op if flip is not None else True)


def _ops(node: Node) -> list[str]:
    return node.op.split("+")


def _params(node: Node, op: str) -> dict:
    return node.params[op] if "+" in node.op else node.params


def draws_all_fed(plan: Plan) -> bool:
    """Whether every random op of the plan's DALI graph takes its draws as data (behind the feed): the graph
    then holds no generator whose state matters, and a pipeline needs no checkpoint to resume."""
    fed = fed_draws(plan)
    taken = {fed.window, fed.flip} if fed is not None else set()
    for node in plan.nodes[len(plan.components):]:
        if node.device == "host" or node.deferred:
            continue
        for op in _ops(node):
            if OPS[op].random and not (node.id in taken and OPS[op].dali_draws is not None):
                return False
    return True
