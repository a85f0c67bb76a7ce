"""The ``batch.mix`` section: batch-level mixup / cutmix (:mod:`feedfast.ops.batchmix`), validated against the outputs.

Example (timm's ``--mixup 0.8 --cutmix 1.0`` defaults)::

    batch:
      size: 128
      mix: {mixup_alpha: 0.8, cutmix_alpha: 1.0, label_smoothing: 0.1, num_classes: 1000}

Every key but ``num_classes`` is optional (timm's defaults); ``image`` and ``label`` name the
output fields mixed when the spec has more than one image or label output.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from feedfast.errors import SpecError
from feedfast.ops.registry import suggest
from feedfast.spec import model as m
from feedfast.spec.batchmix_settings import MixSettings, problem
from feedfast.spec.sections import infer_field

KEYS = tuple(f.name for f in dataclasses.fields(MixSettings))
EXAMPLE = "{mixup_alpha: 0.8, cutmix_alpha: 1.0, num_classes: 1000}"


def parse_mix(v: Any, fields: dict[str, m.FieldPipeline], components: dict[str, m.Component],
              outputs: tuple[str, ...], file: str) -> MixSettings | None:
    """``batch.mix``: None when absent (or null), else checked settings with the mixed fields named."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise SpecError("must be a mapping", file=file, key="batch.mix", value=v, fix=f"e.g. {EXAMPLE}")
    for k in v:
        if k not in KEYS:
            raise SpecError("unknown key", file=file, key=f"batch.mix.{k}", value=k, allowed=", ".join(KEYS),
                            fix=suggest(str(k), KEYS) or f"remove `{k}`")
    if "num_classes" not in v:
        raise SpecError("batch.mix needs num_classes (the width of the soft targets)", file=file,
                        key="batch.mix.num_classes", fix="e.g. `num_classes: 1000` for ImageNet-1k")
    raw = dict(v)
    minmax = raw.get("cutmix_minmax")
    if isinstance(minmax, list):
        raw["cutmix_minmax"] = tuple(minmax)
    settings = MixSettings(**raw)
    bad = problem(settings)
    if bad is not None:
        key, value, allowed = bad
        default = getattr(MixSettings(num_classes=1), key)
        fix = {"num_classes": "the classes of the labels",
               "convention": "set `mode: batch` (and no cutmix_minmax), or `convention: timm`"}.get(
            key, f"timm's default is {default!r}")
        raise SpecError(f"bad value for `{key}`", file=file, key=f"batch.mix.{key}", value=value, allowed=allowed,
                        fix=fix)
    kinds = {name: infer_field(fields[name], components[fields[name].source], file)[-1] for name in outputs}
    image = _field(settings.image, "image", [n for n in outputs if kinds[n].kind in ("image", "tensor")
                                            and len(kinds[n].shape) == 3], outputs, file)
    label = _field(settings.label, "label", [n for n in outputs if kinds[n].kind == "label"], outputs, file)
    layout = kinds[image].layout
    if layout not in ("CHW", "HWC"):
        raise SpecError("the mixed image output has no CHW or HWC layout", file=file, key="batch.mix.image",
                        value=image, fix="end its pipeline with `normalize` (CHW) or a fixed-size image op")
    return dataclasses.replace(settings, image=image, label=label)


def _field(given: str, role: str, candidates: list[str], outputs: tuple[str, ...], file: str) -> str:
    """The output mixed as ``role``: the one given (it must be a candidate), or the only candidate."""
    what = "an image output (a decoded image or normalized tensor)" if role == "image" else "a `label` output"
    if given:
        if given not in candidates:
            raise SpecError(f"batch.mix.{role} must name {what}", file=file, key=f"batch.mix.{role}", value=given,
                            allowed=", ".join(candidates) or "none in this spec",
                            fix=suggest(str(given), list(outputs)) or f"name one of the outputs: {', '.join(outputs)}")
        return given
    if len(candidates) != 1:
        raise SpecError(f"batch.mix cannot tell which output is the {role}: {len(candidates)} candidates",
                        file=file, key=f"batch.mix.{role}", value=None, allowed=", ".join(candidates) or what,
                        fix=f"set `batch.mix.{role}` to one output" if candidates else f"add {what} to outputs")
    return candidates[0]
