"""An image folder listed exactly as torchvision's ``ImageFolder`` lists it, held as arrays and cached.

torchvision's rules (``torchvision/datasets/folder.py``, ``find_classes`` and ``make_dataset``), each kept:

- the classes are the root's entries that are folders (``os.scandir``, ``entry.is_dir()``: a link to a
  folder counts), sorted as Python sorts strings; there is no rule for hidden ones, so ``.git`` or
  ``.ipynb_checkpoints`` is a class like any other (and, holding no image, an error: see below);
- a class's files are those ``os.walk(class_folder, followlinks=True)`` finds, at any depth, links
  followed; the walk's folders are sorted by their whole path string (``sorted(os.walk(...))``), not
  depth first: ``cat/a/``, ``cat/a b/``, ``cat/a.b/``, then ``cat/a/b/`` (`` `` and ``.`` sort before
  ``/``); each folder's file names are sorted; anything that is not a folder counts as a file (a
  broken link too, listed with size -1);
- a file is kept when its path, lower-cased, ends with one of the extensions (``IMG_EXTENSIONS``); a
  hidden file (``.x.jpg``) is kept like any other;
- a folder ``os.walk`` cannot read is left out without a word (feedfast warns, naming it);
- a class with no kept file is an error naming it, unless ``allow_empty``; no class folder at all too.

A cold listing runs the classes on threads (``os.scandir`` and ``stat`` release the GIL), with a
progress bar on stderr when it takes more than two seconds. The listing is cached
(:mod:`feedfast.files.cache`) and read again only when a folder under the root changed.
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from feedfast import _env
from feedfast.errors import ShardError, UserError
from feedfast.files import cache
from feedfast.files.table import FileTable, pack

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's
PROGRESS_DELAY_S = 2.0  # a listing that takes longer shows its progress


@dataclass
class _ClassFiles:
    """What one class folder's walk found: its files (relative to the root), their sizes, the folders read."""

    paths: list[bytes] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)


def list_folder(root: str | os.PathLike[str], *, extensions: tuple[str, ...] = IMG_EXTENSIONS,
                allow_empty: bool = False, cache_dir: Path | None = None, workers: int = 16,
                progress: bool | None = None, refresh: bool = False) -> FileTable:
    """The images of an image folder (``root/<class>/**/<image>``) with torchvision's classes and labels.

    Args:
        root: the folder (``~`` expanded, as torchvision does).
        extensions: the file endings kept, lower case (torchvision's ``IMG_EXTENSIONS`` by default).
        allow_empty: a class folder with no image is a class with no file instead of an error.
        cache_dir: feedfast's cache folder (default :func:`feedfast._env.cache_dir`).
        workers: threads a cold listing runs on, over the classes.
        progress: a progress bar on stderr; None (default): on a terminal, after two seconds.
        refresh: list it again even when the cached listing looks current.

    Raises:
        ShardError: the root is missing or unreadable, holds no class folder, or (without
            ``allow_empty``) a class holds no image; names them.
        UserError: an extension is not lower case, is empty or holds a ``/``; ``workers`` is below 1.
    """
    _check_options(extensions, workers)
    top = os.path.abspath(os.path.expanduser(os.fspath(root)))
    where = cache.entry(cache_dir or _env.cache_dir(), "folder", top, {"extensions": list(extensions)})
    found = None if refresh else cache.load(where)
    if found is None:
        started = time.time_ns()
        table, watched = _list(top, extensions, workers, progress)
        cache.save(where, table, watched, started)
    else:
        table = found
    _check_classes(table, extensions, allow_empty)
    if table.unreadable:
        rel, reason = table.unreadable[0]
        more = f" (and {len(table.unreadable) - 1} more)" if len(table.unreadable) > 1 else ""
        warnings.warn(f"image folder {top!r}: cannot read the folder {rel!r}{more} ({reason}): its images are left "
                      "out, as torchvision's ImageFolder leaves them out; make it readable to include them",
                      stacklevel=2)
    return table


def _check_options(extensions: tuple[str, ...], workers: int) -> None:
    for ext in extensions:
        if not ext or ext != ext.lower() or "/" in ext:
            raise UserError(f"extensions: {ext!r} is not a lower-case file ending (torchvision compares lower-cased "
                            "paths against them, so it would match nothing); pass e.g. ('.jpg', '.png')")
    if workers < 1:
        raise UserError(f"workers must be at least 1, got {workers}")


def find_classes(top: str) -> list[str]:
    """The class folders of ``top``, sorted: torchvision's ``find_classes``.

    Raises:
        ShardError: ``top`` is missing, not a folder or unreadable, or holds no folder.
    """
    try:
        with os.scandir(top) as entries:
            classes = sorted(entry.name for entry in entries if entry.is_dir())
    except OSError as exc:
        raise ShardError(f"cannot read the image folder {top!r}: {exc.strerror}") from exc
    if not classes:
        raise ShardError(f"image folder {top!r} holds no class folder (torchvision's ImageFolder refuses it too): "
                         f"put each class's images in a folder of its own, e.g. {top}/cat/1.jpg, {top}/dog/2.jpg")
    return classes


def _list(top: str, extensions: tuple[str, ...], workers: int, progress: bool | None
          ) -> tuple[FileTable, list[str]]:
    """Walk every class folder (on threads); the table and the folders it was read from (the root first)."""
    from tqdm import tqdm

    classes = find_classes(top)
    with ThreadPoolExecutor(max_workers=min(workers, len(classes))) as pool, \
            tqdm(total=len(classes), desc=f"listing {os.path.basename(top)}", unit="class", leave=False,
                 delay=PROGRESS_DELAY_S, disable=None if progress is None else not progress) as bar:
        def one(name: str) -> _ClassFiles:
            found = _walk_class(top, name, extensions)
            bar.update(1)
            return found

        walked = list(pool.map(one, classes))
    paths = [p for c in walked for p in c.paths]
    sizes = [s for c in walked for s in c.sizes]
    labels = [label for label, c in enumerate(walked) for _ in c.paths]
    unreadable = [u for c in walked for u in c.unreadable]
    table = pack(top, paths, labels, sizes, classes, unreadable)
    return table, [top, *(os.path.join(top, f) for c in walked for f in c.folders)]


def _walk_class(top: str, name: str, extensions: tuple[str, ...]) -> _ClassFiles:
    """One class's files in torchvision's order: ``os.walk(followlinks=True)``'s folders sorted by path, each
    folder's names sorted, kept by extension; each kept file's size (-1 where ``stat`` fails)."""
    walked: list[tuple[str, list[os.DirEntry[str]]]] = []
    found = _ClassFiles()
    pending = [name]
    while pending:  # os.walk's rules: a folder that fails to list, at its start or midway, is left out whole
        rel = pending.pop()
        try:
            with os.scandir(os.path.join(top, rel)) as it:
                entries = list(it)
        except OSError as exc:
            found.unreadable.append((rel, exc.strerror or str(exc)))
            continue
        found.folders.append(rel)
        files = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows links
            except OSError:
                is_dir = False
            if is_dir:
                pending.append(os.path.join(rel, entry.name))
            else:
                files.append(entry)
        walked.append((rel, files))
    for rel, files in sorted(walked, key=lambda w: w[0]):
        for entry in sorted(files, key=lambda e: e.name):
            path = os.path.join(rel, entry.name)
            if path.lower().endswith(extensions):
                found.paths.append(os.fsencode(path))
                found.sizes.append(_size(entry))
    return found


def _size(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat().st_size
    except OSError:
        return -1


def _check_classes(table: FileTable, extensions: tuple[str, ...], allow_empty: bool) -> None:
    """torchvision's error for classes with no file (its message, with the fix)."""
    if allow_empty:
        return
    import numpy as np

    _, counts = table.counts()
    empty = sorted(table.class_names[i] for i in np.flatnonzero(counts == 0).tolist())
    if empty:
        raise ShardError(f"image folder {table.root!r}: Found no valid file for the classes {', '.join(empty)}. "
                         f"Supported extensions are: {', '.join(extensions)} (torchvision's ImageFolder refuses it "
                         "the same way); add images to them, remove them, or pass allow_empty=True")
