"""The torchvision recipe's rate, run by another interpreter (e.g. one with stock Pillow).

``make bench`` runs this with ``.venv-stock/bin/python`` (torch and stock Pillow, no
pillow-simd) so the baseline is also measured as most users run it. Prints one JSON line:
``{"samples_per_s": ..., "cpu_ms_per_sample": ..., "pil": "<PIL version>"}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rows import time_row_cpu, torch_recipe  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shards", nargs="+", required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batches", type=int, default=20)
    args = ap.parse_args()
    import PIL

    rate, cpu_ms = time_row_cpu(lambda: torch_recipe(args.shards, args.batch_size, args.workers),
                                warmup=args.warmup, batches=args.batches)
    print(json.dumps({"samples_per_s": rate, "cpu_ms_per_sample": cpu_ms, "pil": PIL.__version__}))


if __name__ == "__main__":
    main()
