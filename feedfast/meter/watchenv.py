"""``feedfast watch``'s settings as they travel to the job: the one place its variables are named, written and read.

``watch`` writes them into the job's environment (:meth:`WatchSettings.to_env`), so every
process of the job, launched by whatever launcher, inherits them; the start-up hook reads
them once per process (:meth:`WatchSettings.from_env`). A process without ``FEEDFAST_WATCH_DIR``
is not under ``watch`` and measures nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_DIR = "FEEDFAST_WATCH_DIR"
ENV_EVERY = "FEEDFAST_WATCH_EVERY"
ENV_STEPS = "FEEDFAST_WATCH_STEPS"
ENV_SERIES = "FEEDFAST_WATCH_SERIES"
RECORD_VERSION = 1
"""The version of the ``proc-<pid>.json`` records the processes write into ``run_dir``."""


@dataclass(frozen=True)
class WatchSettings:
    """What ``feedfast watch`` tells the job's processes.

    Attributes:
        run_dir: where each process writes ``proc-<pid>.json``.
        every: a line on stderr every this many steps of a loader (0: none).
        steps: stop measuring a loader after this many batches (0: never).
        series: also write each step's wait and step time (for ``--plot``).
    """

    run_dir: Path
    every: int = 0
    steps: int = 0
    series: bool = False

    def to_env(self) -> dict[str, str]:
        """The variables that carry these settings."""
        return {ENV_DIR: str(self.run_dir), ENV_EVERY: str(self.every), ENV_STEPS: str(self.steps),
                ENV_SERIES: "1" if self.series else "0"}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WatchSettings | None:
        """The settings in ``environ``; None without a run folder (not under ``watch``).

        A count that is not a non-negative integer reads as 0 (off): the job runs on.
        """
        if not environ.get(ENV_DIR):
            return None

        def count(name: str) -> int:
            text = environ.get(name, "0").strip()
            return int(text) if text.isdigit() else 0

        return cls(Path(environ[ENV_DIR]), every=count(ENV_EVERY), steps=count(ENV_STEPS),
                   series=environ.get(ENV_SERIES) == "1")
