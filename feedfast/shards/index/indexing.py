"""Cold indexing on every core: the local shards without a fresh index are indexed in worker processes.

:func:`prepare_indexes` leaves every shard with the index :func:`~feedfast.shards.index.tarindex.load_index`
would find, in the same place (beside the shard, else in the cache folder): the workers
call ``load_index`` itself. Which shards need one is judged cheaply in this process (the
index's modification time, first and last lines, and the shard's content fingerprint when
the index records one: :func:`fresh_index`), so a warm start reads no index whole here; a
shard judged fresh that is not after all (a damaged middle line, an offset that misses its
member's header) is rebuilt by ``load_index`` when it is opened, with a warning.

Workers are processes running ``feedfast.shards.index.indexing.serve`` with feedfast's package
loaded without its ``__init__`` (so without torch: a worker starts in about 0.1 s), started
only when two or more shards need work. They take shards in chunks and answer a chunk at
a time. A worker that dies leaves its chunk to this process. Warnings a worker raised
(repeated keys, an unwritable folder) are raised again here; failures are gathered and
the first shard that failed, in the given order, is raised, naming the others.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import signal
import subprocess
import sys
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterable, Sequence

from feedfast import _env
from feedfast.checks.decoders import read_message, write_message
from feedfast.errors import ShardError, UserError
from feedfast.shards.index.check import fingerprint_matches
from feedfast.shards.index.notes import parse_header
from feedfast.shards.index.tarindex import (
    INDEX_VERSION,
    RepeatedKeyWarning,
    forget_warning,
    fresh_samples,
    index_candidates,
    load_index,
    warn_once,
)

MAX_CHUNK = 32  # shards per message at most; fewer when there are few shards per worker
TAIL_BYTES = 4096  # read from an index's end to find its last line (a line of a few components is ~150 bytes)
_BOOT = ("import sys, types; sys.path[:] = {path!r}; package = types.ModuleType('feedfast'); "
         "package.__path__ = {package!r}; sys.modules['feedfast'] = package; "
         "from feedfast.shards.index.indexing import serve; serve()")


@dataclass(frozen=True)
class Indexed:
    """What indexing one shard gave: its sample count, the warnings raised, or the error (then ``samples`` is 0)."""

    path: str
    samples: int
    warned: tuple[tuple[type[Warning], str], ...] = ()
    error: str = ""


def prepare_indexes(paths: Sequence[str], cache_dir: Path, *, workers: int | None = None,
                    progress: bool | None = None, salvage: bool = False) -> None:
    """Make sure every local shard in ``paths`` has a fresh index, building the missing ones in parallel.

    Args:
        paths: local shard paths (what :func:`~feedfast.sources.shardlist.resolve_shards` gives for them).
        cache_dir: feedfast's cache folder, where indexes go when a shard's folder is not writable.
        workers: processes to index in (default: the usable cores); 1 indexes here, one shard after another.
        progress: show a progress bar on stderr; None (default): when stderr is a terminal.
        salvage: index a damaged tar's complete samples before the damage instead of failing
            (``on_error: skip``; see :func:`~feedfast.shards.index.tarindex.load_index`).

    Raises:
        ShardError: a shard is missing, unreadable, compressed, empty, or (without ``salvage``)
            not a tar, truncated or corrupt; names the first such shard in ``paths`` and counts
            the others.
        UserError: ``workers`` is below 1.
    """
    if workers is not None and workers < 1:
        raise UserError(f"workers must be at least 1, got {workers}")
    todo = [os.fspath(p) for p in paths if fresh_index(p, cache_dir) is None]
    if not todo:
        return
    from tqdm import tqdm

    count = min(_env.usable_cores() if workers is None else workers, len(todo))
    with tqdm(total=len(todo), desc="indexing", unit="shard", leave=False,
              disable=None if progress is None else not progress) as bar:
        if count < 2:
            results = []
            for p in todo:
                results.append(index_one(p, cache_dir, salvage=salvage))
                bar.update(1)
        else:
            results = _Pool(count, cache_dir, salvage).run(chunked(todo, count), bar.update)
    _report(results, todo)


def fresh_index(shard: str | os.PathLike[str], cache_dir: Path) -> Path | None:
    """The index :func:`~feedfast.shards.index.tarindex.load_index` would use for ``shard``, judged without reading
    it whole: as new as the shard, ``v1.2`` on its first line with the shard's fingerprint if it records one,
    and its last sample's data inside the shard. None when there is none (or the shard is missing:
    ``load_index`` says so)."""
    try:
        st = os.stat(shard)
    except OSError:
        return None
    try:
        for index in index_candidates(shard, cache_dir):  # the cache's name reads the shard's fingerprint
            verdict = _looks_fresh(index, st, shard)
            if verdict is None:  # its last line is not a sample: decide by reading it whole, as load_index does
                verdict = fresh_samples(shard, index) is not None
            if verdict:
                return index
    except OSError:  # the shard cannot be read (load_index says so)
        return None
    return None


def sample_count(shard: str, cache_dir: Path) -> int:
    """The samples of a shard's index, from its first line (``v1.2 N``) when it is fresh, else from
    :func:`~feedfast.shards.index.tarindex.load_index`."""
    index = fresh_index(shard, cache_dir)
    if index is not None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(index, "rb") as f:
                return int(f.readline().split()[1])
    return len(load_index(shard, cache_dir)[1])


def _looks_fresh(index: Path, shard: os.stat_result, path: str | os.PathLike[str]) -> bool | None:
    """Whether ``index`` is fresh for the shard at ``path`` of this stat, from its first and last lines; None
    when its last line does not tell."""
    try:
        with open(index, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_mtime_ns < shard.st_mtime_ns:
                return False
            head = f.readline()
            f.seek(max(0, st.st_size - TAIL_BYTES))
            tail = f.read()
        notes = parse_header(head.decode("utf-8").rstrip("\r\n"), INDEX_VERSION)
        if notes.fingerprint and not fingerprint_matches(path, notes.fingerprint, shard.st_size):
            return False
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    lines = tail.rstrip(b"\n").rsplit(b"\n", 1)
    if len(lines) < 2:
        return None
    fields = lines[1].split(b" ")
    try:
        ends = [int(fields[i + 1]) + int(fields[i + 2]) for i in range(0, len(fields) - 3, 4)]
    except ValueError:
        return None
    return max(ends) <= shard.st_size if ends and len(fields) % 4 == 0 else None


def chunked(paths: list[str], workers: int) -> list[list[str]]:
    """``paths`` in consecutive chunks: about four per worker, at most :data:`MAX_CHUNK` shards each."""
    size = max(1, min(MAX_CHUNK, -(-len(paths) // (4 * workers))))
    return [paths[i:i + size] for i in range(0, len(paths), size)]


def index_one(path: str, cache_dir: Path, *, salvage: bool = False) -> Indexed:
    """Index one shard with :func:`~feedfast.shards.index.tarindex.load_index`, its warnings and failure as data."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            samples = len(load_index(path, cache_dir, salvage=salvage)[1])
            error = ""
        except ShardError as exc:
            samples, error = 0, str(exc)
        except Exception as exc:  # noqa: BLE001 - raised again in the caller's process, naming the shard
            samples, error = 0, f"cannot index shard {path!r}: {type(exc).__name__}: {exc}"
    for w in caught:  # caught here, not shown: _report raises them again (once)
        if issubclass(w.category, RepeatedKeyWarning):
            forget_warning(str(w.message))
    return Indexed(path, samples, tuple((w.category, str(w.message)) for w in caught), error)


def _report(results: Iterable[Indexed], order: list[str]) -> None:
    """Raise the workers' warnings here, then the first failure in ``order``."""
    by_path = {r.path: r for r in results}
    done = [by_path[p] for p in order]
    for r in done:
        for category, message in r.warned:
            if issubclass(category, RepeatedKeyWarning):  # raised again when the shard is opened here: once
                warn_once(message, category, stacklevel=3)
            else:
                warnings.warn(message, category, stacklevel=3)
    failed = [r for r in done if r.error]
    if failed:
        more = f" ({len(failed) - 1} more shard(s) could not be indexed: " + ", ".join(
            repr(r.path) for r in failed[1:6]) + (", ..." if len(failed) > 6 else "") + ")"
        raise ShardError(failed[0].error + (more if len(failed) > 1 else ""))


class _Pool:
    """Index worker processes, each given one chunk of shards at a time."""

    def __init__(self, size: int, cache_dir: Path, salvage: bool = False) -> None:
        self.cache_dir, self.salvage = cache_dir, salvage
        boot = _BOOT.format(path=sys.path, package=list(sys.modules["feedfast"].__path__))
        self.workers = [subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                        for _ in range(size)]
        self.results: list[Indexed] = []
        self.busy: dict[subprocess.Popen[bytes], list[str]] = {}
        self.selector = selectors.DefaultSelector()

    def run(self, chunks: list[list[str]], done: Callable[[int], object]) -> list[Indexed]:
        """Every chunk's results; ``done(n)`` is called as n more shards are indexed."""
        pending = deque(chunks)
        try:
            for w in self.workers:
                self.selector.register(_pipe(w.stdout), selectors.EVENT_READ, w)
                self._give(w, pending, done)
            while self.busy:
                for key, _ in self.selector.select():
                    w = key.data
                    chunk = self.busy.pop(w)
                    try:
                        answer: list[Indexed] = read_message(_pipe(w.stdout))
                    except (EOFError, OSError, pickle.UnpicklingError):
                        self._lost(w, chunk, done)
                        continue
                    self.results += answer
                    done(len(answer))
                    self._give(w, pending, done)
            for chunk in pending:  # every worker is gone
                self._here(chunk, done)
        finally:
            self.selector.close()
            self.close()
        return self.results

    def _give(self, w: subprocess.Popen[bytes], pending: deque[list[str]], done: Callable[[int], object]) -> None:
        """Send ``w`` the next chunk, if any."""
        if pending:
            chunk = pending.popleft()
            try:
                write_message(_pipe(w.stdin), (chunk, str(self.cache_dir), self.salvage))
            except OSError:
                self._lost(w, chunk, done)
                return
            self.busy[w] = chunk

    def _lost(self, w: subprocess.Popen[bytes], chunk: list[str], done: Callable[[int], object]) -> None:
        """A worker died (or garbled its answer): it is ended, and its chunk indexed here."""
        self.selector.unregister(_pipe(w.stdout))
        if w.poll() is None:
            w.kill()
        warnings.warn(f"an index worker exited (status {w.wait()}) while indexing {chunk[0]!r} and "
                      f"{len(chunk) - 1} more shard(s); indexing them in this process", RuntimeWarning, stacklevel=5)
        self._here(chunk, done)

    def _here(self, chunk: list[str], done: Callable[[int], object]) -> None:
        for path in chunk:
            self.results.append(index_one(path, self.cache_dir, salvage=self.salvage))
            done(1)

    def close(self) -> None:
        """End every worker: its stdin closed (it then exits), killed if it has not within 5 s."""
        for w in self.workers:
            with contextlib.suppress(OSError):  # a dead worker's pipe (BrokenPipeError): nothing left to tell it
                _pipe(w.stdin).close()
        for w in self.workers:
            try:
                w.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
            _pipe(w.stdout).close()


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    assert stream is not None  # Popen was given PIPE
    return stream


def serve() -> None:
    """An index worker's loop: (shards, cache folder, salvage) chunks on stdin, lists of :class:`Indexed` on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle: it ends its workers
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the protocol
    while True:
        try:
            chunk, cache_dir, salvage = read_message(sys.stdin.buffer)
        except EOFError:
            return
        write_message(out, [index_one(p, Path(cache_dir), salvage=salvage) for p in chunk])
