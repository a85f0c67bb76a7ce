"""``feedfast watch``'s start-up hook: it meters every DataLoader iteration of an unchanged job.

``feedfast watch`` starts the job with this folder first on ``PYTHONPATH``, so Python's ``site``
imports this module in every interpreter of the job before the job's own code. It:

1. puts a finder first on ``sys.meta_path`` that waits for ``torch.utils.data.dataloader`` and
   ``feedfast.loader.dataloader`` and, once either has run, wraps on its classes:

   * ``DataLoader.__init__``: notes where the loader was built (:func:`_site`);
   * ``DataLoader.__iter__``: gives the iterator to the loader's
     :class:`feedfast.meter.attach.Tracker` (``iter()`` counts in the epoch's first wait: a
     DataLoader starts its workers there);
   * torch's ``_BaseDataLoaderIter.__next__``, which every torch iterator uses (no workers,
     forked or spawned ones): times each wait. feedfast's ``__iter__`` is a generator, so it
     gets a timing iterator (:class:`_Timed`) around it instead;

2. takes its folder off ``sys.path`` and imports the ``sitecustomize`` it shadows (a
   distribution's, a virtualenv's, a test shim's), as ddtrace's bootstrap does, so the job
   starts as it would without feedfast.

It uses the standard library only: torch and feedfast are not imported here, and feedfast's
meter (which imports torch) is imported when the job first iterates a loader. A process that
never does (torchrun's launcher, a compile worker) pays one dictionary lookup per import. A
failure here, or an interpreter that cannot import feedfast, costs the job one line on stderr
and its figures, never its run. Interpreters started with ``-S``, ``-I`` or ``-E`` skip this
hook and are not measured.
"""

from __future__ import annotations

import functools
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import FrameType, ModuleType
    from typing import Any

SITE = "_feedfast_watch_site"
"""Attribute of a DataLoader: ``(file, line)`` of the job's code that built it."""
TRACKER = "_feedfast_watch_tracker"
"""Attribute of a torch DataLoader iterator: the Tracker timing it."""

_HERE = os.path.dirname(os.path.abspath(__file__))
_FEEDFAST = os.path.dirname(os.path.dirname(_HERE))  # the feedfast package folder
_SKIPPED: list[str] = [_FEEDFAST + os.sep]  # code that is never the job's: feedfast, then torch (added on import)
_LIBRARIES: list[str] = []  # installed code: the standard library and site-packages (filled on first use)
_FIRST_SITE: dict[int, tuple[str, int]] = {}  # id(dataset) -> where the job first built a loader over it
_AGENT: Any = None  # feedfast.meter.attach's Agent once loaded; False when this process is not measured


def _say(message: str) -> None:
    print(f"feedfast watch: {message}", file=sys.stderr, flush=True)


def _agent() -> Any:
    """The process's Agent, imported on first use; False when there is none."""
    global _AGENT
    if _AGENT is None:
        try:
            from feedfast.meter.attach import agent

            _AGENT = agent() or False
        except Exception as exc:  # noqa: BLE001 - the job runs on, unmeasured, and says so
            _say(f"this process ({sys.executable}, pid {os.getpid()}) is not measured: "
                 f"feedfast's meter did not import ({type(exc).__name__}: {exc})")
            _AGENT = False
    return _AGENT


def _is_library(path: str) -> bool:
    if not _LIBRARIES:
        import site
        import sysconfig

        found = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
        found.update(getattr(site, "getsitepackages", list)())
        _LIBRARIES.extend(os.path.join(os.path.abspath(p), "") for p in found)
    return path.startswith("<") or path.startswith(tuple(_LIBRARIES))


def _site(loader: Any) -> tuple[str, int]:
    """Where the job built ``loader``: the first caller outside torch, feedfast and installed libraries.

    Frames of the loader's own ``__init__`` (a subclass calling ``super().__init__``) are
    skipped. A loader built through a library (Lightning adding a DistributedSampler, Accelerate's
    ``prepare``) over a dataset the job already built a loader for takes that loader's site;
    one the job builds itself keeps its own, whatever its dataset.
    """
    frame: FrameType | None = sys._getframe(2)
    by_library = False
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(tuple(_SKIPPED)) and frame.f_locals.get("self") is not loader:
            if not _is_library(path):
                break
            by_library = True
        frame = frame.f_back
    found = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("<unknown>", 0)
    dataset = id(getattr(loader, "dataset", loader))
    site = _FIRST_SITE.get(dataset, found) if by_library else found
    _FIRST_SITE.setdefault(dataset, site)
    return site


def _tracker(loader: Any, kind: str) -> Any:
    agent = _agent()
    return agent.tracker(loader, kind, loader.__dict__.get(SITE)) if agent else None


def _wrap_init(cls: Any) -> None:
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.__dict__[SITE] = _site(self)

    cls.__init__ = __init__


def timed_next(next_: Callable[[Any], Any], tracker: Any, iterator: Any) -> Any:
    """``next_(iterator)`` between the tracker's marks, when it measures this step (the hot path)."""
    if not tracker.begin():
        return next_(iterator)
    try:
        batch = next_(iterator)
    except BaseException:  # StopIteration included: the wait that ends an epoch is dropped
        tracker.cancel()
        raise
    tracker.end(batch)
    return batch


def _patch_torch(module: ModuleType) -> None:
    loader_cls, base = module.DataLoader, module._BaseDataLoaderIter
    _SKIPPED.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(module.__file__ or "")))) + os.sep)
    _wrap_init(loader_cls)
    iter_, next_ = loader_cls.__iter__, base.__next__

    @functools.wraps(iter_)
    def __iter__(self: Any) -> Any:
        tracker = _tracker(self, "torch")
        if tracker is None:
            return iter_(self)
        tracker.iter_begin()
        try:
            iterator = iter_(self)
            iterator.__dict__[TRACKER] = tracker
        except BaseException:  # a failed iter(), or an iterator that is not torch's: not measured
            tracker.cancel()
            raise
        return iterator

    @functools.wraps(next_)
    def __next__(self: Any) -> Any:
        tracker = self.__dict__.get(TRACKER)
        return next_(self) if tracker is None else timed_next(next_, tracker, self)

    loader_cls.__iter__ = __iter__
    base.__next__ = __next__


class _Timed:
    """A feedfast loader's epoch generator, its batches timed by the loader's tracker."""

    __slots__ = ("_inner", "_tracker")

    def __init__(self, inner: Iterator[Any], tracker: Any) -> None:
        self._inner, self._tracker = inner, tracker

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> Any:
        return timed_next(next, self._tracker, self._inner)

    def close(self) -> None:
        """Close the epoch, as the generator's ``close()`` does."""
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


def _patch_feedfast(module: ModuleType) -> None:
    cls = module.DataLoader
    _wrap_init(cls)
    iter_ = cls.__iter__

    @functools.wraps(iter_)
    def __iter__(self: Any) -> Any:
        tracker = _tracker(self, "feedfast")
        if tracker is None:
            return iter_(self)
        tracker.iter_begin()
        try:
            return _Timed(iter_(self), tracker)
        except BaseException:
            tracker.cancel()
            raise

    cls.__iter__ = __iter__


_PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "torch.utils.data.dataloader": _patch_torch,
    "feedfast.loader.dataloader": _patch_feedfast,
}


class _PatchingLoader:
    """Runs a module with its own loader, then patches it; a failed patch leaves the job unmeasured."""

    def __init__(self, inner: Any, patch: Callable[[ModuleType], None]) -> None:
        self._inner, self._patch = inner, patch

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._inner  # the module sees its real loader, as without the hook
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        try:
            self._patch(module)
        except Exception as exc:  # noqa: BLE001 - the job runs on, unmeasured, and says so
            _say(f"cannot attach to {module.__name__} ({type(exc).__name__}: {exc}); its loaders are not measured")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder:
    """First on ``sys.meta_path``: finds the modules in ``_PATCHES`` with the other finders, patching loader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if finder is not self and find is not None else None
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def _chain() -> None:
    """Take this folder off ``sys.path`` and import the ``sitecustomize`` it hid, if there is one."""
    ours = sys.modules.get("sitecustomize")
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    if _HERE not in paths:
        return
    del sys.path[paths.index(_HERE)]
    sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401 - the next one on sys.path
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        sys.modules.setdefault("sitecustomize", ours)  # type: ignore[arg-type]


def _install() -> None:
    for name, patch in _PATCHES.items():
        if name in sys.modules:  # imported before site ran (a .pth file): patch it now
            patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())  # type: ignore[arg-type]


if __name__ == "sitecustomize":  # started by site; imported by its dotted name (a test, a benchmark) it only defines
    _install()
    _chain()
