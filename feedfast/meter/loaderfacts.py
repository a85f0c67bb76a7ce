"""What a loader declares about itself, for ``feedfast watch``'s advice: workers, pinning, batch size, data.

Read once per loader when the job first iterates it, from attributes torch's DataLoader and
feedfast's both have with torch's meaning (DESIGN: drop-in means other people's scripts run).
The data the loader reads is looked for in its dataset's attributes (:func:`data_source`),
so the advice can write the ``feedfast.DataLoader(...)`` line for it.
"""

from __future__ import annotations

import os
import types
from collections import deque
from typing import Any

_SHARD_ENDS = (".tar", ".tar.gz", ".tgz")
_MAX_OBJECTS = 200
_MAX_DEPTH = 4


def torch_facts(loader: Any) -> dict[str, Any]:
    """A torch DataLoader's settings: ``num_workers``, ``pin_memory``, ``batch_size``, the dataset and its data."""
    dataset = getattr(loader, "dataset", None)
    return {
        "loader_class": _qualname(loader),
        "num_workers": getattr(loader, "num_workers", None),
        "pin_memory": getattr(loader, "pin_memory", None),
        "batch_size": getattr(loader, "batch_size", None),
        "persistent_workers": getattr(loader, "persistent_workers", None),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "dataset_class": _qualname(dataset),
        "data": data_source(dataset),
    }


def feedfast_facts(loader: Any) -> dict[str, Any]:
    """A feedfast DataLoader's settings: threads (as ``num_workers``), backend, placement, its shards."""
    spec, plan, shards = getattr(loader, "spec", None), getattr(loader, "plan", None), getattr(loader, "shards", None)
    paths = list(getattr(shards, "paths", ()) or ())
    return {
        "loader_class": _qualname(loader),
        "num_workers": getattr(loader, "threads", None),
        "pin_memory": None,
        "batch_size": getattr(spec, "batch_size", None),
        "backend": getattr(loader, "backend", None),
        "placement": getattr(plan, "placement", None),
        "spec_name": getattr(spec, "name", None),
        "dataset_class": None,
        "data": {"kind": "tar-shards", "shards": [str(p) for p in paths[:3]], "count": len(paths)} if paths else None,
    }


def data_source(dataset: Any) -> dict[str, Any] | None:
    """Where a dataset reads from, when it says: tar shards or an image folder.

    Looks breadth first through the dataset's attributes (and those of the datasets it wraps,
    lists included), at most 4 levels and 200 objects deep:

    ============================================  ===========================================
    found                                         result
    ============================================  ===========================================
    strings ending in .tar, .tar.gz or .tgz       ``{"kind": "tar-shards", "shards": [...]}``
    a ``root`` folder beside ``samples``/``imgs``  ``{"kind": "image-folder", "path": root}``
      (torchvision's ImageFolder, DatasetFolder)
    nothing of the above                          None
    ============================================  ===========================================
    """
    queue: deque[tuple[Any, int]] = deque([(dataset, 0)])
    seen: set[int] = set()
    while queue and len(seen) < _MAX_OBJECTS:
        obj, depth = queue.popleft()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        found = _source_of(obj)
        if found is not None:
            return found
        if depth < _MAX_DEPTH:
            queue.extend((child, depth + 1) for child in _children(obj))
    return None


def _source_of(obj: Any) -> dict[str, Any] | None:
    attrs = _attributes(obj)
    root = attrs.get("root")
    if isinstance(root, (str, os.PathLike)) and ("samples" in attrs or "imgs" in attrs) and os.path.isdir(root):
        return {"kind": "image-folder", "path": os.fspath(root)}
    values = obj if isinstance(obj, (list, tuple)) else attrs.values()
    shards = [os.fspath(v) for v in values if isinstance(v, (str, os.PathLike)) and _is_shard(os.fspath(v))]
    if isinstance(obj, str) and _is_shard(obj):
        shards = [obj]
    return {"kind": "tar-shards", "shards": shards[:3], "count": len(shards)} if shards else None


def _is_shard(text: Any) -> bool:
    return isinstance(text, str) and text.lower().endswith(_SHARD_ENDS)


def _attributes(obj: Any) -> dict[str, Any]:
    try:
        return dict(vars(obj))
    except TypeError:
        return {}


def _children(obj: Any) -> list[Any]:
    """Lists, tuples and plain objects among ``obj``'s items or attributes (no modules, classes or functions)."""
    values = list(obj[:64]) if isinstance(obj, (list, tuple)) else list(_attributes(obj).values())
    return [v for v in values if isinstance(v, (list, tuple)) or (hasattr(v, "__dict__") and not callable(v)
                                                                   and not isinstance(v, types.ModuleType))]


def _qualname(obj: Any) -> str | None:
    if obj is None:
        return None
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"
