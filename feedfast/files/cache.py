"""Listings kept in feedfast's cache folder, and the rule that says when a kept one is stale.

A listing is kept under ``<cache>/files/<key>/``, where the key digests what was listed (a folder's
absolute path, or a file list's) and how (the extensions). Each state of it is a version folder::

    <key>/current            the name of the version to read
    <key>/<version>/
        paths.npy            uint8: the paths, end to end       (the arrays of feedfast.files.table,
        offsets.npy          int64 [files + 1]                   loaded as memory maps)
        labels.npy, sizes.npy  int64 [files]
        watched.npz          the folders (and list file) it was read from: paths, (mtime_ns, inode, size)
        meta.json            root, classes, unreadable folders

A kept listing is used while every watched path has the (mtime_ns, inode, size) it had: a file added,
removed or renamed changes its folder's mtime, a folder replaced its inode. A file rewritten in place
changes none of them; reading it finds its size changed and names it (:mod:`feedfast.files.read`).
A listing is not kept when a watched path changed within ``RACY_NS`` of the listing's start (or after
it): a change in the same clock tick as the one before it would leave the mtime as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from feedfast.files.table import FileTable
from feedfast.shards.index.tarindex import write_atomic

FORMAT = 1  # bump when the layout or what a file means changes
RACY_NS = 2_000_000_000
_ARRAYS = ("paths", "offsets", "labels", "sizes")


def entry(cache_dir: Path, kind: str, source: str, options: dict[str, Any]) -> Path:
    """The cache folder of the listing of ``source`` (an absolute path) of this ``kind`` with these options."""
    text = json.dumps([FORMAT, kind, os.fsencode(source).hex(), options], sort_keys=True)
    return cache_dir / "files" / hashlib.sha256(text.encode()).hexdigest()[:24]


def stats(paths: list[str]) -> np.ndarray:
    """int64 [paths, 3]: each path's (mtime_ns, inode, size), links followed; -1s where it cannot be read."""
    out = np.full((len(paths), 3), -1, dtype=np.int64)
    for i, path in enumerate(paths):
        try:
            st = os.stat(path)
        except OSError:
            continue
        out[i] = st.st_mtime_ns, st.st_ino, st.st_size
    return out


def load(where: Path) -> FileTable | None:
    """The kept listing, its arrays mapped; None when there is none, it is damaged, or a watched path changed."""
    try:
        version = where / (where / "current").read_text(encoding="utf-8").strip()
        if not version.name or not (version / "done").is_file():
            return None
        with np.load(version / "watched.npz") as watched:
            blob, offsets, kept = watched["paths"].tobytes(), watched["offsets"].tolist(), watched["stats"]
        meta = json.loads((version / "meta.json").read_text(encoding="utf-8"))
        arrays = {name: _load_array(version / f"{name}.npy") for name in _ARRAYS}
    except (OSError, ValueError, KeyError):
        return None
    paths = [os.fsdecode(blob[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
    if not np.array_equal(stats(paths), kept):
        return None
    return FileTable(meta["root"], arrays["paths"], arrays["offsets"], arrays["labels"], arrays["sizes"],
                     tuple(meta["classes"]), tuple((rel, why) for rel, why in meta["unreadable"]),
                     str(meta.get("digest", "")),
                     (int(meta["summary"][0]), tuple(meta["summary"][1])) if "summary" in meta else None)


def _load_array(path: Path) -> np.ndarray:
    """The array mapped (read at random rows through ``FileTable.take``, which does not touch the map)."""
    try:
        return np.load(path, mmap_mode="r")
    except ValueError:  # an empty array cannot be mapped
        return np.load(path)


def save(where: Path, table: FileTable, watched: list[str], started_ns: int) -> bool:
    """Keep ``table``, read from the ``watched`` paths in a listing that began at ``started_ns`` (``time_ns``);
    False when it is not kept (a watched path changed too recently to be trusted, see the module docstring).
    Another process keeping the same listing at once is harmless: the last to finish names its copy current."""
    now = stats(watched)
    if (now[:, 0] < 0).any() or (now[:, 0] >= started_ns - RACY_NS).any():
        return False
    offsets = np.zeros(len(watched) + 1, dtype=np.int64)
    encoded = [os.fsencode(p) for p in watched]
    np.cumsum([len(p) for p in encoded], out=offsets[1:])
    version = hashlib.sha256(np.ascontiguousarray(now).tobytes() + b"".join(encoded)).hexdigest()[:16]
    folder = where / version
    if not (folder / "done").is_file():
        _write(folder, table, np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets, now)
    write_atomic(where / "current", version)
    for old in where.iterdir():  # earlier versions: a process that has one mapped keeps reading it
        if old.is_dir() and old.name != version and not old.name.startswith("."):
            shutil.rmtree(old, ignore_errors=True)
    return True


def _write(folder: Path, table: FileTable, watched_blob: np.ndarray, watched_offsets: np.ndarray,
           watched_stats: np.ndarray) -> None:
    """Write a version folder beside its place, then move it into place whole."""
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        for name in _ARRAYS:
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(getattr(table, name)))
        np.savez(tmp / "watched.npz", paths=watched_blob, offsets=watched_offsets, stats=watched_stats)
        meta = {"format": FORMAT, "root": table.root, "classes": list(table.class_names),
                "unreadable": [list(u) for u in table.unreadable], "digest": table.content_digest()}
        total, per_class = table.counts()
        meta["summary"] = [total, per_class.tolist()]
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        (tmp / "done").write_text("", encoding="utf-8")
        try:
            os.replace(tmp, folder)
        except OSError:  # another process kept the same version meanwhile
            if not (folder / "done").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
