"""Build hook: the shipped pipelines travel in the wheel as package data.

``pipelines/*.yaml`` at the repository root is the one source of truth. Building a wheel
copies it to ``feedfast/pipelines/`` inside the build, where ``feedfast.spec.shipped`` finds
it once installed; an editable install (``pip install -e .``) copies nothing and reads the
repository's folder in place. Everything else is declared in ``pyproject.toml``.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PIPELINES = Path(__file__).resolve().parent / "pipelines"


class BuildPyWithPipelines(build_py):
    """``build_py`` that also copies ``pipelines/*.yaml`` to ``<build>/feedfast/pipelines/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        specs = sorted(PIPELINES.glob("*.yaml"))
        if not specs:
            raise SystemExit(f"no shipped pipelines in {PIPELINES}: a wheel without them cannot find specs by name")
        target = Path(self.build_lib) / "feedfast" / "pipelines"
        self.mkpath(str(target))
        for spec in specs:
            self.copy_file(str(spec), str(target / spec.name))


setup(cmdclass={"build_py": BuildPyWithPipelines})
