"""What every command shares: finding specs, the demo dataset, JSON output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from feedfast.errors import SpecError, UserError

DEMO = {"samples": 1024, "per_shard": 128, "seed": 0}


def find_spec(name: str) -> Path:
    """A spec path: as given when it exists, else a shipped pipeline by name (``imagenet-train``).

    Resolution is :func:`feedfast.spec.shipped.resolve_spec_path`'s; this translates its
    error into a one-line ``UserError`` for the CLI.
    """
    from feedfast.spec.shipped import resolve_spec_path, shipped_names

    try:
        return resolve_spec_path(name)
    except SpecError as exc:
        shipped = ", ".join(shipped_names()) or "none in this installation"
        raise UserError(f"spec not found: {name!r} is not a file, nor a shipped pipeline ({shipped}); "
                        f"{exc.fix}") from exc


def demo_shards(quiet: bool = False) -> str:
    """The demo dataset's shard pattern, generating it once in the cache folder."""
    from feedfast._pil import require_pil

    require_pil("the demo dataset")  # before the import: the synthetic-image writer imports PIL
    from feedfast.write.demo import shard_pattern, synth_dataset

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
    """GPU utilization for a table: a percentage, ``no GPU ...``, or ``unavailable`` with the reason."""
    if util is not None:
        return f"{util:.0f} %"
    if status.removeprefix("unavailable: ").startswith("no GPU ("):
        return status.removeprefix("unavailable: ")
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
