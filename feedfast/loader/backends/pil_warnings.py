"""Warnings PIL gives while a backend decodes a sample ("Corrupt EXIF data") go to logging, not the terminal.

``warnings.catch_warnings`` swaps process-wide state and is not safe in threads (the
threaded backend decodes in several, and the loader's producer thread runs beside the
training loop). So the routing is per thread: :func:`routed` marks the calling thread as
decoding a sample, and a wrapper around ``warnings.showwarning`` (installed once, and again
if something replaced it since) sends what such a thread warns to the ``feedfast.pil``
logger at DEBUG level, with the sample when the caller names it. Warnings of every other
thread are shown as before. Python's filters still apply first: a message already shown
once at a place is not shown (or logged) again under the default filter, and
``-W error`` still makes a warning an error (the sample then fails as undecodable).
"""

from __future__ import annotations

import logging
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

log = logging.getLogger("feedfast.pil")

_local = threading.local()
_lock = threading.Lock()


def _show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
          line: str | None = None) -> None:
    sample = getattr(_local, "sample", None)
    if sample is None:
        _show.original(message, category, filename, lineno, file, line)  # type: ignore[attr-defined]
        return
    where = f"shard {sample[0]!r}, sample {sample[1]!r}" if sample else "a sample"
    log.debug("PIL warned while decoding %s: %s: %s", where, category.__name__, message)


def _install() -> None:
    with _lock:
        if warnings.showwarning is not _show:
            _show.original = warnings.showwarning  # type: ignore[attr-defined]
            warnings.showwarning = _show


@contextmanager
def routed(sample: Sequence[str] | None = None) -> Iterator[None]:
    """Within the block, warnings of this thread go to logging, naming ``sample`` (shard, key) when given
    (any sequence of the two: read only when a warning comes)."""
    if warnings.showwarning is not _show:
        _install()
    previous = getattr(_local, "sample", None)
    _local.sample = sample if sample is not None else ()
    try:
        yield
    finally:
        _local.sample = previous
