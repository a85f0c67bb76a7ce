"""Build hooks: the shipped pipelines travel in the wheel as package data; the C extension is optional.

``pipelines/*.yaml`` at the repository root is the one source of truth. Building a wheel
copies it to ``feedfast/pipelines/`` inside the build, where ``feedfast.spec.shipped`` finds
it once installed; an editable install (``pip install -e .``) copies nothing and reads the
repository's folder in place.

``feedfast._native`` (``feedfast/_native.c``) holds the threaded CPU path's hot loops: JPEG
region decoding against the system's libjpeg-turbo (the libjpeg Pillow builds against;
headers: ``libjpeg-dev``), Pillow's resize (``feedfast/_resample.c``, a port) and ``normalize``
in one pass, built without fused multiply-adds so its floats are NumPy's (and its resize's
coefficients Pillow's) bit for bit. It is optional: where it does not build, the install goes
on without it and feedfast runs those steps in Pillow and NumPy (``feedfast doctor`` says
which). ``feedfast._augment`` (``feedfast/_augment.c``) runs the automatic-augmentation sub-ops over arrays
with Pillow's pixels (affine transforms, tables, histograms); optional too, Pillow runs them where it did not
build. Everything else is declared in ``pyproject.toml``.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
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


NATIVE = Extension("feedfast._native", sources=["feedfast/_native.c", "feedfast/_resample.c",
                                                 "feedfast/_resample_simd.c", "feedfast/_mix.c"],
                   depends=["feedfast/_resample.h", "feedfast/_resample_simd.h", "feedfast/_mix.h", "feedfast/_raws.h"],
                   libraries=["jpeg"],
                   extra_compile_args=["-O3", "-ffp-contract=off"], optional=True)

PLAN = Extension("feedfast._plan", sources=["feedfast/_plan.c"], depends=["feedfast/_raws.h"], libraries=["jpeg"],
                 extra_compile_args=["-O3", "-ffp-contract=off"], optional=True)

AUGMENT = Extension("feedfast._augment", sources=["feedfast/_augment.c"],
                    extra_compile_args=["-O3", "-ffp-contract=off", "-fwrapv"], optional=True)

setup(cmdclass={"build_py": BuildPyWithPipelines}, ext_modules=[NATIVE, PLAN, AUGMENT])
