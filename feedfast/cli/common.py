"""What every command shares: finding specs, the demo dataset, JSON output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from feedfast.errors import UserError

REPO_PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"
DEMO = {"samples": 1024, "per_shard": 128, "seed": 0}


def find_spec(name: str) -> Path:
    """A spec path: as given, or a shipped pipeline by name (``imagenet-train``)."""
    p = Path(name)
    if p.exists():
        return p
    for cand in (REPO_PIPELINES / name, REPO_PIPELINES / f"{name}.yaml"):
        if cand.is_file():
            return cand
    shipped = ", ".join(sorted(x.stem for x in REPO_PIPELINES.glob("*.yaml"))) or "none found"
    raise UserError(f"spec not found: {name!r} (a file path, or a shipped pipeline: {shipped})")


def demo_shards(quiet: bool = False) -> str:
    """The demo dataset's shard pattern, generating it once in the cache folder."""
    from feedfast.sources.demo import shard_pattern, synth_dataset

    n, k, seed = DEMO["samples"], DEMO["per_shard"], DEMO["seed"]

    def announce(out: Path) -> None:
        if not quiet:
            print(f"generating the demo dataset ({n} photo-like JPEGs, {-(-n // k)} shards) in {out} ...",
                  file=sys.stderr)

    return shard_pattern(synth_dataset(samples=n, per_shard=k, seed=seed, announce=announce))


def check_positive(name: str, value: float | None) -> None:
    """Raise ``UserError`` unless ``value`` is None or > 0; ``name`` is the option without dashes."""
    if value is not None and value <= 0:
        raise UserError(f"--{name} must be > 0, got {value:g}")


def gpu_cell(util: float | None, status: str) -> str:
    """GPU utilization for a table: a percentage, or ``unavailable`` with the reason."""
    if util is not None:
        return f"{util:.0f} %"
    return "unavailable" + (f" ({status.removeprefix('unavailable: ')})" if status else "")


def write_json(path: str | None, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` (``-`` for stdout); nothing when path is None."""
    if path is None:
        return
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    if path == "-":
        print(text)
    else:
        Path(path).write_text(text + "\n", encoding="utf-8")


def table(rows: list[tuple[str, Any]]) -> str:
    """Two aligned columns."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
