"""``feedfast shards synth | index | inspect``: make, index and look at tar shards."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from feedfast import _env

EXAMPLES = """examples:
  feedfast shards make imagenet/train data/train --shard-size 256MB
  feedfast shards make labels.csv data/train --per-shard 1000
  feedfast shards synth data/demo --samples 2000 --per-shard 250
  feedfast shards index 'data/train-{0000..0099}.tar'
  feedfast shards inspect 'data/*.tar' --json
Shards are named PREFIX-NNNN.tar by both writers (train-0000.tar, ...), indexed beside them.
"""

SYNTH_EXAMPLES = """examples:
  feedfast shards synth data/demo                       # 1,000 photo-like JPEGs in 10 shards
  feedfast shards synth data/demo --samples 2000 --per-shard 250 --classes 10
  feedfast shards synth data/small --min-side 64 --max-side 96 --seed 3
"""

MAKE_EXAMPLES = """examples:
  feedfast shards make imagenet/train data/train        # one subfolder per class, 256 MB shards
  feedfast shards make labels.csv data/train --per-shard 1000   # path,label rows
  feedfast shards make items.jsonl data/train --no-shuffle      # {"path": ..., "label": ...} lines
  feedfast shards make imagenet/train data/train --overwrite    # replace the shards already there
"""

INDEX_EXAMPLES = """examples:
  feedfast shards index 'data/train-{0000..0099}.tar'
  feedfast shards index data/*.tar
"""

INSPECT_EXAMPLES = """examples:
  feedfast shards inspect 'data/train-*.tar'            # counts, components, label mixing, problems:
                                                        # damaged or compressed tars, untrusted indexes, repeated keys
  feedfast shards inspect 'data/train-*.tar' --check    # also decode every image, as the loader checks them
  feedfast shards inspect 'data/*.tar' --json > report.json
"""


def add_parser(sub: Any) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("shards", help="make, index and inspect shards", epilog=EXAMPLES, formatter_class=raw)
    s = p.add_subparsers(dest="shards_cmd", required=True)
    syn = s.add_parser("synth", help="write synthetic photo-like JPEG shards with indexes", epilog=SYNTH_EXAMPLES,
                       formatter_class=raw)
    syn.add_argument("out", help="output folder (created)")
    syn.add_argument("--samples", type=int, default=1000, help="images to write (default 1000)")
    syn.add_argument("--per-shard", type=int, default=100, help="samples per shard (default 100)")
    syn.add_argument("--seed", type=int, default=0, help="seed: the same seed writes the same bytes (default 0)")
    syn.add_argument("--min-side", type=int, default=300, help="smallest shorter side, pixels (default 300)")
    syn.add_argument("--max-side", type=int, default=500, help="largest shorter side, pixels (default 500)")
    syn.add_argument("--classes", type=int, default=1000, help="labels drawn from 0..N-1 (default 1000)")
    syn.add_argument("--prefix", default="train", help="shard and key prefix (default train: train-0000.tar)")
    syn.set_defaults(func=synth)
    mk = s.add_parser("make", help="pack an image-folder tree or a CSV/JSONL list of path,label into shards",
                      epilog=MAKE_EXAMPLES, formatter_class=raw)
    mk.add_argument("src", help="a folder with one subfolder per class, or a .csv / .jsonl list")
    mk.add_argument("out", help="output folder (created; refused if it already holds shards, see --overwrite)")
    size = mk.add_mutually_exclusive_group()
    size.add_argument("--per-shard", type=int, default=None, help="samples per shard")
    size.add_argument("--shard-size", default=None, help="bytes per shard, e.g. 256MB (default)")
    mk.add_argument("--prefix", default="train", help="shard name prefix (default train: train-0000.tar)")
    mk.add_argument("--overwrite", action="store_true",
                    help="remove the shards, indexes and classes.json already in OUT (default: refuse such a folder)")
    mk.add_argument("--no-shuffle", action="store_true",
                    help="keep the listed order (default: samples shuffled across shards, so no shard is class-sorted)")
    mk.add_argument("--seed", type=int, default=0, help="seed of the shuffle (default 0)")
    mk.set_defaults(func=make)
    idx = s.add_parser("index", help="build (or refresh) DALI indexes for shards", epilog=INDEX_EXAMPLES,
                       formatter_class=raw)
    idx.add_argument("shards", nargs="+", help="shard paths, globs or brace patterns")
    idx.set_defaults(func=index)
    ins = s.add_parser("inspect", help="count samples and components, report problems (damaged tars, indexes the "
                       "loader would rebuild, repeated keys, labels) and what the loader does with each",
                       epilog=INSPECT_EXAMPLES,
                       formatter_class=raw)
    ins.add_argument("shards", nargs="+", help="shard paths, globs or brace patterns")
    ins.add_argument("--json", action="store_true", help="print the report as JSON")
    ins.add_argument("--check", action="store_true",
                     help="decode every image (PIL and DALI's CPU decoder) and report those neither can read")
    ins.add_argument("--image-ext", default="jpg;jpeg;png;gif;bmp;tif;tiff;webp;ppm;pgm;jp2;webp",
                     help="extensions that are images, ';'-separated (default: the usual ones)")
    ins.set_defaults(func=inspect)


def synth(args: argparse.Namespace) -> int:
    """Write synthetic shards, then index them."""
    from feedfast.shards.index.indexing import prepare_indexes
    from feedfast.write.synth import synth_shards

    paths = synth_shards(args.out, samples=args.samples, per_shard=args.per_shard, seed=args.seed,
                         min_side=args.min_side, max_side=args.max_side, num_classes=args.classes, prefix=args.prefix)
    prepare_indexes([str(p) for p in paths], _env.cache_dir())
    print(f"wrote {len(paths)} shards with indexes to {args.out} ({args.samples} samples)")
    return 0


def make(args: argparse.Namespace) -> int:
    """Pack files into shards, then index them."""
    from pathlib import Path

    from feedfast.errors import UserError
    from feedfast.shards.index.indexing import prepare_indexes
    from feedfast.write import make as mk

    src, out = Path(args.src), Path(args.out)
    if args.per_shard is not None and args.per_shard < 1:
        raise UserError(f"--per-shard must be >= 1, got {args.per_shard}")
    if src.is_dir():
        items, classes = mk.from_folder(src)
        mk.prepare_out(out, overwrite=args.overwrite)
        (out / "classes.json").write_text(json.dumps(classes, indent=1) + "\n", encoding="utf-8")
    elif src.is_file() and src.suffix.lower() in (".csv", ".jsonl"):
        items = mk.from_list(src)
        mk.prepare_out(out, overwrite=args.overwrite)
    else:
        raise UserError(f"{src} is neither a folder of class subfolders nor a .csv/.jsonl list")
    if not args.no_shuffle:
        items = mk.shuffled(items, args.seed)
    limit = None if args.per_shard else mk.parse_size(args.shard_size or "256MB")
    paths = mk.write_shards(items, out, per_shard=args.per_shard, shard_size=limit, prefix=args.prefix)
    prepare_indexes([str(p) for p in paths], _env.cache_dir())
    order = "in the listed order" if args.no_shuffle else f"shuffled across shards (seed {args.seed})"
    print(f"wrote {len(items)} samples {order} in {len(paths)} shards with indexes to {out}")
    return 0


def index(args: argparse.Namespace) -> int:
    """Build indexes for local shards, on every core (a progress bar on a terminal)."""
    from feedfast.shards.index.indexing import prepare_indexes, sample_count
    from feedfast.sources.shardlist import resolve_shards

    paths = resolve_shards(args.shards)
    prepare_indexes(paths, _env.cache_dir())
    total = sum(sample_count(p, _env.cache_dir()) for p in paths)
    print(f"indexed {len(paths)} shards, {total} samples")
    return 0


def inspect(args: argparse.Namespace) -> int:
    """Counts, components and sizes of shards, and every problem with what the loader does about it."""
    from feedfast.cli.shardstats import inspect_shard, label_mixing
    from feedfast.sources.shardlist import resolve_shards

    report: dict[str, Any] = {"shards": [], "samples": 0, "components": Counter(), "problems": []}
    labels: list[list[int]] = []
    for p in _progress(resolve_shards(args.shards), "inspecting"):
        shard = inspect_shard(p, check=args.check, image_exts=_exts(args.image_ext), cache_dir=_env.cache_dir())
        report["shards"].append({"path": p, "samples": shard.samples, "components": shard.components,
                                 "distinct_labels": len(set(shard.labels))})
        report["samples"] += shard.samples
        report["components"].update(shard.components)
        report["problems"] += shard.problems
        labels.append(shard.labels)
    report["components"] = dict(report["components"])
    mixing = label_mixing(labels)
    if mixing is not None:
        report["label_mixing"] = mixing
        if mixing["ratio"] < 0.5:
            report["problems"].append(
                f"shards look class-sorted: a shard holds {mixing['mean_distinct']:.1f} distinct labels on average "
                f"where shuffled shards of the same sizes would hold {mixing['expected_distinct']:.1f}; feedfast's "
                "shuffle=True still permutes local shards, but buffer and window shuffles (DALI's, WebDataset's, "
                "remote shards) give batches of few classes: rewrite them with `feedfast shards make` (it shuffles)")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{len(report['shards'])} shards, {report['samples']} samples; components: {report['components']}")
        if mixing is not None:
            print(f"labels: {mixing['labels']} distinct; {mixing['mean_distinct']:.1f} per shard on average, "
                  f"{mixing['ratio']:.2f} of what shuffled shards would hold")
        for prob in report["problems"]:
            print(f"  problem: {prob}")
    return 0


def _progress(items: Any, what: str) -> Any:
    """A progress bar on stderr over ``items`` (a list), shown when there are several and stderr is a terminal."""
    from tqdm import tqdm

    items = list(items)
    return tqdm(items, desc=what, unit="shard", disable=len(items) < 2 or None, leave=False)


def _exts(text: str) -> set[str]:
    return {e.strip().lower().lstrip(".") for e in text.split(";") if e.strip()}
