"""Lets Lightning import beside a torchvision that cannot load (test subprocesses only).

torchmetrics, which Lightning imports, imports torchvision whenever its distribution is
installed. A torchvision built for another torch (PyPI's CUDA build next to a ``+cpu`` torch
wheel) fails with "operator torchvision::nms does not exist" and takes Lightning down with
it. The Lightning tests put this folder on PYTHONPATH: when torchvision imports, nothing
changes; when it does not, torchvision is hidden, as if not installed, and a line on stderr
says so.
"""

from __future__ import annotations

import sys


def _hide_broken_torchvision() -> None:
    try:
        import torchvision  # noqa: F401
        return
    except ModuleNotFoundError:
        return
    except Exception as exc:  # a build for another torch raises RuntimeError or OSError
        reason = f"{type(exc).__name__}: {exc}"
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
    sys.modules["torchvision"] = None  # type: ignore[assignment]  # `import torchvision` now raises ImportError
    try:
        from lightning_utilities.core import imports
    except ImportError:
        return
    from packaging.requirements import Requirement

    check = imports.RequirementCache._check_requirement

    def check_hiding_torchvision(self: imports.RequirementCache) -> None:
        check(self)
        if Requirement(self.requirement).name == "torchvision":
            self.available = False

    imports.RequirementCache._check_requirement = check_hiding_torchvision  # type: ignore[method-assign]
    print(f"tests/lightning_env: torchvision is installed but does not import ({reason}); hidden from Lightning",
          file=sys.stderr)


_hide_broken_torchvision()
