"""The pipelines shipped with feedfast, found by name wherever feedfast is installed.

``pipelines/*.yaml`` at the repository root is the one source of truth. A wheel carries a copy
as package data in ``feedfast/pipelines/`` (``setup.py`` copies it at build time); a source
checkout or an editable install (``pip install -e .``) reads the repository's folder in place.

How a spec argument is resolved (:func:`resolve_spec_path`):

====================================  =====================================================
given                                 read
====================================  =====================================================
``my/spec.yaml`` (an existing path)   that file: a path that exists always wins
``imagenet-train``                    the shipped ``imagenet-train.yaml``
``imagenet-train.yaml``               the same, when no such file is in the working folder
``pipelines/imagenet-train.yaml``     the same, when no such file is in the working folder
``imagenet-trian``, ``x/y.yaml``      ``SpecError``: the shipped names and how to give a path
====================================  =====================================================
"""

from __future__ import annotations

import os
from pathlib import Path

from feedfast.errors import SpecError
from feedfast.ops.registry import suggest

_PACKAGE = Path(__file__).resolve().parents[1]
PACKAGED = _PACKAGE / "pipelines"  # in an installed wheel
SOURCE = _PACKAGE.parent / "pipelines"  # in a source checkout or an editable install
SUFFIX = ".yaml"


def shipped_dir() -> Path | None:
    """The folder of the shipped pipelines, or None when this installation has none."""
    if PACKAGED.is_dir():
        return PACKAGED
    if SOURCE.is_dir() and (SOURCE.parent / "pyproject.toml").is_file():
        return SOURCE
    return None


def shipped_names() -> list[str]:
    """The names of the shipped pipelines, sorted (``imagenet-train``, ``imagenet-val``, ...)."""
    folder = shipped_dir()
    return sorted(p.stem for p in folder.glob(f"*{SUFFIX}")) if folder else []


def shipped_path(name: str) -> Path | None:
    """The file of a shipped pipeline given as ``NAME``, ``NAME.yaml`` or ``pipelines/NAME.yaml``."""
    path = Path(name)
    if path.parent not in (Path("."), Path("pipelines")) or path.suffix not in ("", SUFFIX):
        return None
    folder = shipped_dir()
    if folder is None:
        return None
    stem = path.name.removesuffix(SUFFIX)
    candidate = folder / f"{stem}{SUFFIX}"
    return candidate if stem and candidate.is_file() else None


def resolve_spec_path(spec: str | os.PathLike[str]) -> Path:
    """The file a spec argument names: an existing path, else a shipped pipeline.

    Raises:
        SpecError: neither an existing path nor a shipped name; the message lists the
            shipped names and says how to give a file path.
    """
    path = Path(spec)
    if path.exists():
        return path
    found = shipped_path(str(spec))
    if found is not None:
        return found
    names = shipped_names()
    hint = suggest(path.name.removesuffix(SUFFIX), names)
    raise SpecError(
        "spec file not found, and not the name of a shipped pipeline", file=str(spec),
        allowed="a shipped pipeline name (" + (", ".join(names) or "none in this installation") + ")"
                " or the path of a .yaml, .toml or .json file",
        fix=(f"{hint} or " if hint else "") + "give the path of a spec file that exists from the working folder, "
            "e.g. ./my-spec.yaml or an absolute path",
    )
