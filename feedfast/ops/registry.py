"""The op registry: the one list of op names feedfast knows."""

from __future__ import annotations

import difflib

from feedfast.ops import color, generic, geometry, recipe
from feedfast.ops.base import OpDef

OPS: dict[str, OpDef] = {
    op.name: op
    for op in (
        geometry.DECODE,
        geometry.RANDOM_RESIZED_CROP,
        geometry.RESIZE,
        geometry.CENTER_CROP,
        geometry.RANDOM_CROP,
        geometry.FLIP,
        geometry.ROTATE,
        color.NORMALIZE,
        color.COLOR_JITTER,
        color.RANDOM_GRAYSCALE,
        color.GAUSSIAN_BLUR,
        recipe.TRIVIAL_AUGMENT_WIDE,
        recipe.RAND_AUGMENT,
        recipe.AUTO_AUGMENT,
        recipe.RANDOM_ERASING,
        generic.LABEL,
        generic.JSON,
        generic.NPY,
        generic.BYTES,
    )
}


def suggest(name: str, choices: list[str] | tuple[str, ...] | None = None) -> str:
    """A did-you-mean hint for a misspelt name, or an empty string."""
    pool = list(OPS) if choices is None else list(choices)
    close = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else ""


def get_op(name: str) -> OpDef | None:
    """The op called ``name``, or None."""
    return OPS.get(name)
