"""The spec's run-time sections: ``loader`` (how the loader runs) and ``tune`` (whether it tunes itself).

Neither changes the data: the samples, their order and their augmentation are fixed by the
rest of the spec and the seed, so a state taken under one ``loader``/``tune`` resumes under
another (they are left out of the spec digest a state carries). ``loader.backend`` is the one
exception to "any value resumes any state": the backends draw their own augmentation, so a
state names the backend it was taken with (see :mod:`feedfast.loader.backends`).

.. code-block:: yaml

    loader:            # defaults for DataLoader arguments left unset (the arguments win)
      threads: 2       # num_workers
      prefetch: 3      # prefetch_factor
      backend: threads # auto, dali, threads or pil
    tune:
      enabled: true    # DataLoader(tune=True)
      budget: 0.1      # share of the first epoch the search may take (batches, at least 8)

``feedfast tune`` prints its decision as a ``loader`` section to paste.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from feedfast.errors import SpecError

BACKENDS = ("auto", "dali", "threads", "pil")
"""The loader's backends (:mod:`feedfast.loader.backends`), for the spec, the DataLoader and the CLI."""


@dataclass(frozen=True)
class LoaderSettings:
    """The ``loader`` section: defaults for ``num_workers``, ``prefetch_factor`` and ``backend``."""

    threads: int | None = None
    prefetch: int | None = None
    backend: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The keys that are set."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class TuneSettings:
    """The ``tune`` section: whether the loader tunes itself, and the share of the first epoch it may take."""

    enabled: bool = False
    budget: float = 0.1

    def to_dict(self) -> dict[str, Any]:
        """Both keys."""
        return dataclasses.asdict(self)


def _section(v: Any, key: str, file: str, allowed: tuple[str, ...], example: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise SpecError("must be a mapping", file=file, key=key, value=v, fix=f"e.g. {example}")
    for k in v:
        if k not in allowed:
            raise SpecError("unknown key", file=file, key=f"{key}.{k}", value=k, allowed=", ".join(allowed),
                            fix=f"remove `{k}`")
    return v


def _count(v: Any, key: str, file: str, low: int, high: int) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise SpecError("bad value", file=file, key=key, value=v, allowed=f"an integer from {low} to {high}",
                        fix="remove the key for the default")
    return v


def parse_loader(v: Any, file: str) -> LoaderSettings:
    """The ``loader`` section (every key optional)."""
    d = _section(v, "loader", file, ("threads", "prefetch", "backend"), "{threads: 2, prefetch: 2}")
    backend = d.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise SpecError("bad value", file=file, key="loader.backend", value=backend,
                        allowed="one of " + ", ".join(BACKENDS), fix="remove the key for 'auto'")
    return LoaderSettings(threads=_count(d.get("threads"), "loader.threads", file, 1, 1024),
                          prefetch=_count(d.get("prefetch"), "loader.prefetch", file, 1, 64), backend=backend)


def parse_tune(v: Any, file: str) -> TuneSettings:
    """The ``tune`` section (``enabled`` false and ``budget`` 0.1 by default)."""
    d = _section(v, "tune", file, ("enabled", "budget"), "{enabled: true, budget: 0.1}")
    enabled = d.get("enabled", False)
    if not isinstance(enabled, bool):
        raise SpecError("bad value", file=file, key="tune.enabled", value=enabled, allowed="true or false")
    budget = d.get("budget", 0.1)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1:
        raise SpecError("bad value", file=file, key="tune.budget", value=budget,
                        allowed="a share of the first epoch in (0, 1]", fix="e.g. 0.1 (the default)")
    return TuneSettings(enabled=enabled, budget=float(budget))
