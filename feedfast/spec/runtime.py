"""The spec's run-time sections: ``loader`` (how the loader runs) and ``tune`` (whether it tunes itself).

Neither changes the data: the samples, their order and their augmentation are fixed by the
rest of the spec and the seed, so a state taken under one ``loader``/``tune`` resumes under
another (they are left out of the spec digest a state carries). ``loader.backend`` is the one
exception to "any value resumes any state": the backends draw their own augmentation, so a
state names the backend it was taken with (see :mod:`feedfast.loader.backends.choose`).

.. code-block:: yaml

    loader:            # defaults for DataLoader arguments left unset (the arguments win)
      threads: 2       # num_workers
      prefetch: 3      # prefetch_factor
      backend: threads # auto, dali, threads or pil
    tune:
      enabled: true    # DataLoader(tune=True)
      budget: 0.1      # share of the first epoch the search may take (batches, at least 8)

``feedfast tune`` prints its decision as a ``loader`` section to paste. The sections are
validated with the others (:func:`feedfast.spec.sections.parse_loader`, ``parse_tune``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

BACKENDS = ("auto", "dali", "threads", "pil")
"""The loader's backends (:mod:`feedfast.loader.backends.choose`), for the spec, the DataLoader and the CLI."""


@dataclass(frozen=True)
class LoaderSection:
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
