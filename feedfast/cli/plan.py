"""``feedfast plan``: the compiled plan of a spec, each node with its device and signature."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from feedfast.cli.common import find_spec

if TYPE_CHECKING:
    from feedfast.compile.plan import Plan

EXAMPLES = """examples:
  feedfast plan imagenet-train --device gpu
  feedfast plan pipelines/imagenet-val.yaml --json
  feedfast plan imagenet-train --set pipeline.image[1].size=192
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="show the compiled plan of a spec", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="spec file or shipped pipeline name")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None,
                   help="where the pipeline runs (default: the spec's device; auto is gpu when CUDA is there)")
    p.add_argument("--consumer", choices=("cpu", "cuda"), default="cpu", help="where batches are delivered")
    p.add_argument("--no-fuse", action="store_true", help="skip the fusion pass")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec value, e.g. pipeline.image[1].size=192 (repeatable)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def header(plan: Plan, *, asked: str) -> str:
    """The plan's first line: the spec file, where the pipeline runs (and what was asked), where batches go.

    Example: ``plan of pipelines/imagenet-train.yaml: pipeline on cpu (device auto), batches to cuda;
    image normalized on cuda after a uint8 copy``.
    """
    line = f"plan of {plan.spec.file}: pipeline on {plan.placement} (device {asked}), batches to {plan.consumer}"
    deferred = sorted(plan.deferred_outputs())
    if deferred:
        line += f"; {', '.join(deferred)} normalized on {plan.consumer} after a uint8 copy"
    return line


def run(args: argparse.Namespace) -> int:
    """Print the plan."""
    from feedfast.compile.build import build_plan
    from feedfast.spec.load import load_spec

    spec = load_spec(find_spec(args.spec), args.overrides)
    plan = build_plan(spec, device=args.device, consumer=args.consumer, fuse=not args.no_fuse)
    if plan.consumer != args.consumer:  # build_plan runs the consumer's passes without recording it
        plan = dataclasses.replace(plan, consumer=args.consumer)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    print(header(plan, asked=args.device or spec.device))
    for n in plan.nodes:
        ins = ",".join(map(str, n.inputs)) or "-"
        print(f"  [{n.id}] {n.dali_op:<36} {n.device:<6} in={ins:<4} {n.sig.describe()}  ({n.op})")
    print("  outputs: " + ", ".join(f"{k}=[{v}]" for k, v in plan.outputs.items()))
    print("  passes:  " + ", ".join(plan.passes))
    if spec.mix is not None:
        print("  mix:     " + spec.mix.describe())
    if spec.repeats > 1:
        print(f"  repeats: each sample {spec.repeats} times an epoch, each copy with its own draws, the copies on "
              "different ranks where the world allows (an epoch keeps the dataset's length)")
    if (draws := draws_line(plan)) is not None:
        print("  draws:   " + draws)
    print("  backend: " + backend_line(plan))
    return 0


def backend_line(plan: Plan) -> str:
    """What ``backend="auto"`` runs this plan on, and why: over local shards and over remote ones (http, s3,
    gs, the shard cache: read by range), and on the threaded path how it makes a batch."""
    from feedfast.loader.backends.choose import auto_backend
    from feedfast.sources.dataset import ShardSet

    local = auto_backend(plan, ShardSet((), (), ()))
    remote = auto_backend(plan, ShardSet(("http://remote/shard.tar",), ("",), (1,), kinds=("http",)))
    how = ""
    if local[0] == "threads":
        from feedfast.loader.backends.cpu.threads import chunk_way

        how = f"; {chunk_way(plan)}"
    if local[0] == remote[0]:
        alike = ": remote ones read by range ahead of decoding" if local[0] == "threads" else ""
        return f"auto: {local[0]}, because {local[1]}{how} (local and remote shards alike{alike})"
    return f"auto over local shards: {local[0]}, because {local[1]}{how}; over remote shards: {remote[0]}, " \
           f"because {remote[1]}"


def draws_line(plan: Plan) -> str | None:
    """On DALI, which nodes are fed each sample's draws behind feedfast's feed (as the other backends draw them),
    and so which DALI operator they run as there; None where none is."""
    from feedfast.compile.dali_draws import fed_draws

    fed = fed_draws(plan)
    if fed is None:
        return None
    parts = []
    if fed.window is not None:
        decoded = plan.nodes[fed.window].op.startswith("decode")
        parts.append(f"[{fed.window}] its crop window ({'decoders.image_slice' if decoded else 'slice'} + resize)")
    if fed.flip is not None:
        folded = not fed.flip_vertical
        parts.append(f"[{fed.flip}] its flips ({'crop_mirror_normalize mirror' if folded else 'flip'})")
    return (f"on dali behind feedfast's feed (every epoch), each sample's draws "
            f"are fed as data, drawn as threads and pil draw them: {', '.join(parts)}")
