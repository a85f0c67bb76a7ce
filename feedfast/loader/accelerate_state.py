"""Telling Hugging Face Accelerate where a feedfast epoch ends, as its prepared torch DataLoaders do.

Accelerate syncs gradients under ``accelerator.accumulate(model)`` every ``num_steps`` steps
and on the last batch of an epoch. It learns the last batch from the loader it is iterating:
``accelerator.prepare`` wraps a torch DataLoader in a ``DataLoaderShard``, which registers
itself with the process's ``GradientState`` (``_add_dataloader``) when iteration starts,
sets ``end_of_dataloader`` before it yields the last batch, and unregisters at the end.
``prepare`` returns any other iterable unchanged, so over a bare iterable
``end_of_dataloader`` is never set and the epoch's last partial accumulation is never synced.

feedfast's loader does what ``DataLoaderShard`` does, through :class:`EpochEnd` (the two
attributes ``GradientState`` reads): when an ``Accelerator`` (hence a ``GradientState``)
exists in the process, each iteration registers one, marks it before the epoch's last batch
is handed over, and removes it when the iteration ends. Nothing is imported from
Accelerate: a process that never imported it pays one dictionary look-up per epoch.
``remainder`` stays -1 (no samples added to make the ranks even, as under ``last_batch: partial``
where every sample is seen once): ``gather_for_metrics`` then keeps every gathered sample.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any


class EpochEnd:
    """What Accelerate's ``GradientState`` reads from the loader it is in: ``end_of_dataloader``, ``remainder``."""

    def __init__(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1


def gradient_state() -> Any | None:
    """This process's Accelerate ``GradientState`` when an ``Accelerator`` made one, else None.

    None too, with a warning, when the installed Accelerate lacks the registration calls used here.
    """
    module = sys.modules.get("accelerate.state")
    cls = getattr(module, "GradientState", None) if module is not None else None
    if cls is None or not getattr(cls, "_shared_state", None):
        return None  # Accelerate is not imported, or no Accelerator (no GradientState) was made
    state = cls()
    if not (hasattr(state, "_add_dataloader") and hasattr(state, "_remove_dataloader")):
        warnings.warn("this Accelerate's GradientState has no _add_dataloader/_remove_dataloader: gradient "
                      "accumulation will not sync on the epoch's last batch of a feedfast loader", stacklevel=3)
        return None
    return state


class AccelerateEpoch:
    """One iteration's registration with ``GradientState`` (a no-op when there is none)."""

    def __init__(self) -> None:
        self.state = gradient_state()
        self.end = EpochEnd()  # held here: GradientState keeps only a weak reference
        if self.state is not None:
            self.state._add_dataloader(self.end)

    def last_batch(self) -> None:
        """The batch about to be handed over is the epoch's last."""
        self.end.end_of_dataloader = True

    def close(self) -> None:
        """The iteration ended (its epoch's end, a break, an error): unregister."""
        if self.state is not None:
            self.state._remove_dataloader(self.end)
            self.state = None
