"""Import torchvision's transforms for the baselines, or say how to install them.

torchvision is an optional dependency (the ``compare`` extra); ``make setup`` installs the
release that matches the installed torch, so it imports as it does for any user.
"""

from __future__ import annotations

from types import ModuleType

from feedfast.errors import UserError

INSTALL_HINT = (
    "pip install 'feedfast[compare]' (beside pillow-simd: install torchvision and its dependencies but Pillow with "
    "--no-deps, as `make setup` does, so that torchvision's Pillow dependency leaves PIL alone)"
)
"""How to get torchvision, in the words of the error raised when it is missing."""


def transforms() -> ModuleType:
    """``torchvision.transforms``, importing torchvision on first use.

    Raises:
        UserError: torchvision is not installed, or was built for another torch and cannot be imported.
    """
    try:
        from torchvision import transforms as module
    except ImportError as exc:
        raise UserError(f"the torchvision baseline needs torchvision, which is not installed: {INSTALL_HINT}") from exc
    except RuntimeError as exc:  # a torchvision built for another torch: "operator torchvision::nms does not exist"
        raise UserError(f"torchvision cannot be imported with this torch ({exc}): install the torchvision release "
                        f"matching your torch (torch 2.N.P pairs with torchvision 0.(N+15).P); {INSTALL_HINT}") from exc
    return module
