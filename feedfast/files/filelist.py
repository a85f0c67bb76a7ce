"""A file list: images named one a line with their labels, as text or CSV, held as arrays and cached.

Two forms, told apart by the list's name:

- text (any name but ``*.csv``): ``path label`` lines; the label is the line's last field, the path
  everything before it (so a path may hold spaces: ``cats/my cat.jpg 3``); blank lines and lines
  starting with ``#`` are skipped;
- CSV (``*.csv``): ``path,label`` rows (quoted as CSV quotes, so a path may hold a comma), with or
  without a header: a first row whose label is not a number is a header and is skipped.

A label is a whole number, 0 or more. A relative path is relative to the list's folder; an absolute
one is kept. Every listed file must exist (each is ``stat``-ed, on threads, for its size). A bad line
is a :class:`~feedfast.errors.UserError` naming the list, the line number, what is wrong and the fix.
"""

from __future__ import annotations

import csv
import io
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from feedfast import _env
from feedfast.errors import ShardError, UserError
from feedfast.files import cache
from feedfast.files.table import FileTable, pack

_LABEL = re.compile(r"[0-9]+")
_FIXES = {"text": "write one `path label` line per file, e.g. `cats/1.jpg 3`",
          "csv": "write one `path,label` row per file, e.g. `cats/1.jpg,3`"}


def read_file_list(path: str | os.PathLike[str], *, cache_dir: Path | None = None, workers: int = 16,
                   refresh: bool = False) -> FileTable:
    """The files and labels a file list names (see the module docstring for the forms).

    Args:
        path: the list (``~`` expanded).
        cache_dir: feedfast's cache folder (default :func:`feedfast._env.cache_dir`).
        workers: threads the listed files are ``stat``-ed on.
        refresh: read it again even when the cached listing looks current.

    Raises:
        UserError: a line is malformed (names the list, the line and the fix), or the list names no file.
        ShardError: the list cannot be read, or a file it names is missing (names the list, line and file).
    """
    if workers < 1:
        raise UserError(f"workers must be at least 1, got {workers}")
    source = os.path.abspath(os.path.expanduser(os.fspath(path)))
    where = cache.entry(cache_dir or _env.cache_dir(), "list", source, {})
    found = None if refresh else cache.load(where)
    if found is not None:
        return found
    started = time.time_ns()
    root = os.path.dirname(source)
    numbers, paths, labels = [], [], []
    for number, name, label in parse(source):
        numbers.append(number)
        paths.append(name)
        labels.append(label)
    if not paths:
        raise UserError(f"file list {source!r} names no file: {_FIXES[_form(source)]}")
    with ThreadPoolExecutor(max_workers=min(workers, len(paths))) as pool:
        sizes = list(pool.map(lambda p: _size(os.path.join(root, p)), paths, chunksize=256))
    for number, name, size in zip(numbers, paths, sizes):
        if isinstance(size, OSError):
            raise ShardError(f"file list {source!r}, line {number}: cannot read {name!r} "
                             f"({size.strerror}); a relative path is taken from the list's folder {root!r}: "
                             "fix the line, or restore the file")
    table = pack(root, [os.fsencode(p) for p in paths], labels, [s for s in sizes if isinstance(s, int)])
    folders = sorted({os.path.dirname(os.path.join(root, p)) for p in paths})
    cache.save(where, table, [source, *folders], started)
    return table


def _size(path: str) -> int | OSError:
    try:
        return os.stat(path).st_size
    except OSError as exc:
        return exc


def _form(path: str) -> str:
    return "csv" if path.lower().endswith(".csv") else "text"


def parse(path: str) -> Iterator[tuple[int, str, int]]:
    """Each entry of a file list as (line number, path as written, label).

    Raises:
        ShardError: the list cannot be read.
        UserError: a line is malformed; names the list, the line and the fix.
    """
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise ShardError(f"cannot read the file list {path!r}: {exc.strerror}") from exc
    form = _form(path)
    rows = _csv_rows(path, text) if form == "csv" else _text_rows(text)
    first = True
    for number, fields in rows:
        if len(fields) != 2 or not fields[0]:
            what = "it has no label" if len(fields) < 2 else f"it has {len(fields)} fields, not 2"
            raise UserError(f"file list {path!r}, line {number}: {what}: {_shown(fields, form)}; {_FIXES[form]}")
        name, label = fields
        if not _LABEL.fullmatch(label):
            if first and form == "csv":  # a header
                first = False
                continue
            raise UserError(f"file list {path!r}, line {number}: the label {label!r} is not a whole number 0 or "
                            f"more: {_shown(fields, form)}; {_FIXES[form]} (labels are class numbers)")
        first = False
        yield number, name, int(label)


def _text_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines: a path may hold \x1c, \u2028, ...
        line = line.strip()
        if line and not line.startswith("#"):
            yield number, line.rsplit(None, 1)


def _csv_rows(path: str, text: str) -> Iterator[tuple[int, list[str]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for fields in reader:
            if any(f.strip() for f in fields):
                yield reader.line_num, [f.strip() for f in fields]
    except csv.Error as exc:
        raise UserError(f"file list {path!r}, line {reader.line_num}: not CSV ({exc}); {_FIXES['csv']}") from exc


def _shown(fields: list[str], form: str) -> str:
    return repr((" " if form == "text" else ",").join(fields)[:200])
