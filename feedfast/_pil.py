"""Which PIL feedfast runs on: Pillow or pillow-simd, exactly one, chosen by an extra.

Both distributions install the same ``PIL`` package, and pip cannot express "one of the two",
so feedfast's base dependencies hold neither (as they hold no DALI build): a user picks one
with ``feedfast[pillow]`` or ``feedfast[simd]``, and no later ``pip install -U feedfast``
puts Pillow back over pillow-simd. Without a PIL, this module's check says what to install.
"""

from __future__ import annotations

import importlib.util

from feedfast.errors import BackendError

MISSING = ("PIL is not installed; feedfast decodes with Pillow or pillow-simd (exactly one: both install `PIL`): "
           "pip install 'feedfast[pillow]' (stock Pillow) or 'feedfast[simd]' (pillow-simd, faster on the CPU)")


def require_pil(purpose: str) -> None:
    """Raise ``BackendError`` naming both ways to install a PIL when ``PIL`` cannot be imported.

    Args:
        purpose: what needs PIL, for the message (``"the demo dataset"``).
    """
    if importlib.util.find_spec("PIL") is None:
        raise BackendError(f"{purpose} needs PIL. {MISSING}")
