"""Import torchvision's transforms for the baselines, or say how to install them.

torchvision is an optional dependency (the ``compare`` extra). Its transforms are pure
Python over PIL and torch; only ``torchvision.ops`` needs its compiled ``_C`` library.
A torchvision wheel built for another torch variant (the CUDA wheel from PyPI beside a CPU
build of torch: the only pairing a CPU-only mirror may offer) cannot load ``_C``, and
torchvision 0.28's ``__init__`` then fails registering fake kernels for two ops that
``_C`` would have defined. :func:`transforms` declares those two op schemas (no kernels)
and imports again, with a warning: the transforms feedfast uses are unaffected.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType
from typing import Any

from feedfast.errors import UserError

INSTALL_HINT = (
    "pip install 'feedfast[compare]' (beside pillow-simd: pip install --no-deps torchvision==<the release "
    "matching your torch>, as `make setup` does, so that torchvision's Pillow dependency leaves PIL alone)"
)
"""How to get torchvision, in the words of the error raised when it is missing."""

_MISSING_OPS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_stand_in: Any = None  # the torch.library.Library holding the declared schemas; kept alive


def transforms() -> ModuleType:
    """``torchvision.transforms``, importing torchvision on first use.

    Raises:
        UserError: torchvision is not installed, or cannot be imported with this torch.
    """
    try:
        from torchvision import transforms as module
    except ImportError as exc:
        raise UserError(f"the torchvision baseline needs torchvision, which is not installed: {INSTALL_HINT}") from exc
    except RuntimeError as exc:
        if "torchvision::" not in str(exc) or _stand_in is not None:
            raise UserError(f"torchvision cannot be imported with this torch ({exc}): {INSTALL_HINT}") from exc
        _declare_missing_ops(exc)
        from torchvision import transforms as module
    return module


def _declare_missing_ops(exc: RuntimeError) -> None:
    """Declare the ops torchvision's ``_C`` would have defined, and forget the half-imported package."""
    global _stand_in
    import torch

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _stand_in = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - schemas only, no kernels
    for schema in _MISSING_OPS.values():
        _stand_in.define(schema)
    warnings.warn(f"torchvision's C++ ops do not load with torch {torch.__version__} ({exc}); its transforms are "
                  "pure Python and run unchanged, torchvision.ops will not work. Install the torchvision build "
                  "matching this torch to silence this.", RuntimeWarning, stacklevel=3)
