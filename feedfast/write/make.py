"""Writing WebDataset shards from an image-folder tree or a CSV/JSONL list of (path, label).

An image folder has one subfolder per class (``train/n01440764/*.JPEG``); classes are numbered
in sorted order and the names are written to ``classes.json`` beside the shards. A list file
is ``.csv`` (``path,label``, a header line is allowed) or ``.jsonl`` (``{"path": ..., "label":
...}``); relative paths are read from the list's folder. Each sample becomes ``KEY.EXT`` (the
file's own bytes and extension) and ``KEY.cls``; the key is the file's path without its
extension, dots replaced by ``_`` (the extension starts at the first dot of a name).

An output folder that already holds shards (``*.tar``), indexes (``*.idx``) or a
``classes.json`` is refused: old shards left beside new ones would be read as one dataset.
``overwrite=True`` (``--overwrite``) removes exactly those files first; other files stay.

Samples are shuffled across shards before packing (:func:`shuffled`, seeded; ``--no-shuffle``
keeps the listed order): an image-folder tree packed as it lies gives class-sorted shards, on
which any reader that shuffles within a buffer or a window (DALI's, WebDataset's, feedfast's
for remote shards) yields batches of a few classes.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from feedfast.errors import UserError

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".jp2"}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.I)


@dataclass(frozen=True)
class Item:
    """One file to pack: its path, its label and its sample key."""

    path: Path
    label: int
    key: str


def parse_size(text: str) -> int:
    """``256MB``, ``1.5GiB``, ``500k`` or a number of bytes, as bytes."""
    m = _SIZE.match(text)
    if not m:
        raise UserError(f"--shard-size must look like 256MB, 1GB or a number of bytes, got {text!r}")
    unit = (m.group(2) or "").lower().rstrip("b").rstrip("i")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[unit]
    return int(float(m.group(1)) * scale)


def _key(rel: Path) -> str:
    stem = str(rel.with_suffix("")).replace(os.sep, "/")
    return re.sub(r"[.\s]", "_", stem)


def from_folder(root: Path) -> tuple[list[Item], list[str]]:
    """Items of an image-folder tree, and the class names in label order."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise UserError(f"{root} has no class subfolders (expected e.g. {root}/cat/*.jpg, {root}/dog/*.jpg)")
    items = []
    for label, name in enumerate(classes):
        for f in sorted((root / name).rglob("*")):
            if f.is_file() and f.suffix.lower() in IMAGE_EXTS:
                items.append(Item(f, label, _key(f.relative_to(root))))
    return items, classes


def shuffled(items: list[Item], seed: int) -> list[Item]:
    """``items`` in a random order fixed by ``seed``."""
    import random

    out = list(items)
    random.Random(f"feedfast-make/{seed}").shuffle(out)
    return out


def from_list(path: Path) -> list[Item]:
    """Items of a ``.csv`` or ``.jsonl`` list of (path, label)."""
    base = path.parent
    rows: list[tuple[int, str, object]] = []
    with open(path, encoding="utf-8", newline="") as f:
        if path.suffix.lower() == ".jsonl":
            for n, line in enumerate(f, 1):
                if line.strip():
                    obj = _json_line(path, n, line)
                    rows.append((n, str(obj.get("path", "")), obj.get("label")))
        else:
            for n, row in enumerate(csv.reader(f), 1):
                if len(row) < 2 or (n == 1 and not row[1].strip().lstrip("-").isdigit()):
                    if n == 1 and len(row) >= 2:
                        continue  # a header line
                    raise UserError(f"{path}:{n}: expected `path,label`, got {row!r}")
                rows.append((n, row[0].strip(), row[1].strip()))
    items = []
    for n, rel, label in rows:
        if not isinstance(label, int) and not (isinstance(label, str) and label.lstrip("-").isdigit()):
            raise UserError(f"{path}:{n}: label must be an integer, got {label!r}")
        p = Path(rel) if os.path.isabs(rel) else base / rel
        items.append(Item(p, int(label), _key(Path(rel))))
    return items


def _json_line(path: Path, n: int, line: str) -> dict:  # type: ignore[type-arg]
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise UserError(f"{path}:{n}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}:{n}: expected an object with `path` and `label`")
    return obj


OWNED_PATTERNS = ("*.tar", "*.idx", "classes.json")


def prepare_out(out: Path, *, overwrite: bool) -> None:
    """Make ``out`` ready for new shards: refuse old shards there, or remove them when ``overwrite``.

    Raises:
        UserError: ``out`` is a file, or holds shards, indexes or classes.json and ``overwrite`` is False.
    """
    if out.exists() and not out.is_dir():
        raise UserError(f"output {out} exists and is not a folder")
    old = sorted(p for pattern in OWNED_PATTERNS for p in out.glob(pattern)) if out.is_dir() else []
    if old and not overwrite:
        names = ", ".join(p.name for p in old[:3]) + (f" and {len(old) - 3} more" if len(old) > 3 else "")
        raise UserError(f"output folder {out} already holds shards or indexes ({names}); they would be read "
                        "together with the new ones: choose an empty folder, or pass --overwrite to remove them")
    for p in old:
        p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def write_shards(items: list[Item], out: Path, *, per_shard: int | None = None, shard_size: int | None = None,
                 prefix: str = "train") -> list[Path]:
    """Pack items into ``{prefix}-NNNN.tar`` files (as ``shards synth`` names them: ``train-0000.tar``, more
    digits past 9999); a shard closes at ``per_shard`` samples or ``shard_size`` bytes."""
    if not items:
        raise UserError("nothing to pack: no image files found")
    seen: set[str] = set()
    for it in items:
        if it.key in seen:
            raise UserError(f"two files map to the sample key {it.key!r} (e.g. a.jpg and a.png); rename one")
        seen.add(it.key)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[Path] = []
    tar, size, count = None, 0, 0
    for it in items:
        if tar is None or (per_shard and count >= per_shard) or (shard_size and size >= shard_size):
            if tar is not None:
                tar.close()
            shards.append(out / f"{prefix}-{len(shards):04d}.tar")
            tar, size, count = tarfile.open(shards[-1], "w", format=tarfile.PAX_FORMAT), 0, 0
        size += _add_sample(tar, it)
        count += 1
    if tar is not None:
        tar.close()
    return shards


def _add_sample(tar: tarfile.TarFile, it: Item) -> int:
    try:
        data = it.path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {it.path}: {exc.strerror}") from exc
    ext = it.path.suffix.lower().lstrip(".")
    total = 0
    for name, blob in ((f"{it.key}.{ext}", data), (f"{it.key}.cls", str(it.label).encode())):
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(blob), 0o644
        tar.addfile(info, io.BytesIO(blob))
        total += len(blob) + 1024
    return total
