"""``feedfast plan``: the compiled plan of a spec, each node with its device and signature."""

from __future__ import annotations

import argparse
import json
from typing import Any

from feedfast.cli.common import find_spec

EXAMPLES = """examples:
  feedfast plan imagenet-train --device gpu
  feedfast plan pipelines/imagenet-val.yaml --json
  feedfast plan imagenet-train --set pipeline.image[1].size=192
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="show the compiled plan of a spec", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="spec file or shipped pipeline name")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None)
    p.add_argument("--consumer", choices=("cpu", "cuda"), default="cpu", help="where batches are delivered")
    p.add_argument("--no-fuse", action="store_true", help="skip the fusion pass")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the plan."""
    from feedfast.compile.plan import build_plan
    from feedfast.spec.load import load_spec

    spec = load_spec(find_spec(args.spec), args.overrides)
    plan = build_plan(spec, device=args.device, consumer=args.consumer, fuse=not args.no_fuse)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    print(f"plan of {spec.file}: placement {plan.placement}, consumer {plan.consumer}")
    for n in plan.nodes:
        ins = ",".join(map(str, n.inputs)) or "-"
        print(f"  [{n.id}] {n.dali_op:<36} {n.device:<6} in={ins:<4} {n.sig.describe()}  ({n.op})")
    print("  outputs: " + ", ".join(f"{k}=[{v}]" for k, v in plan.outputs.items()))
    print("  passes:  " + ", ".join(plan.passes))
    return 0
