"""A batch mix's settings (the spec's ``batch.mix``) and their check: plain data, without torch.

The mix itself is :mod:`feedfast.ops.batchmix`; a spec is read, checked and described (``feedfast
plan``, ``feedfast shards``) without importing torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MODES = ("batch", "pair", "elem")
CONVENTIONS = ("timm", "torchvision")


@dataclass(frozen=True)
class MixSettings:
    """A batch mix (the spec's ``batch.mix``; timm's ``Mixup`` arguments, plus where and how).

    Attributes:
        num_classes: classes of the one-hot targets (labels must lie in ``[0, num_classes)``).
        image, label: the output fields mixed (empty: the spec's one image output, one label output).
        convention: ``timm`` (partner ``B-1-i``, timm's box) or ``torchvision`` (partner ``i-1``, its box).
    """

    num_classes: int
    mixup_alpha: float = 1.0
    cutmix_alpha: float = 0.0
    cutmix_minmax: tuple[float, float] | None = None
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"
    correct_lam: bool = True
    label_smoothing: float = 0.1
    convention: str = "timm"
    image: str = ""
    label: str = ""

    @property
    def cutmix(self) -> float:
        """The cutmix alpha in effect (timm forces 1 when ``cutmix_minmax`` is set)."""
        return 1.0 if self.cutmix_minmax is not None else self.cutmix_alpha

    def to_dict(self) -> dict[str, Any]:
        """As the spec's ``batch.mix`` section."""
        out = dataclasses.asdict(self)
        out["cutmix_minmax"] = list(self.cutmix_minmax) if self.cutmix_minmax is not None else None
        return {k: v for k, v in out.items() if not (k in ("image", "label") and not v)}

    def describe(self) -> str:
        """One line for ``feedfast plan``."""
        kinds = [f"mixup alpha {self.mixup_alpha:g}"] if self.mixup_alpha > 0 else []
        if self.cutmix > 0:
            kinds.append(f"cutmix alpha {self.cutmix:g}" + (f" minmax {list(self.cutmix_minmax)}"
                                                             if self.cutmix_minmax else ""))
        switch = f", cutmix with p {self.switch_prob:g}" if len(kinds) == 2 else ""
        return (f"{' / '.join(kinds)}{switch}, p {self.prob:g} per {self.mode}, label smoothing "
                f"{self.label_smoothing:g}, {self.num_classes} classes, {self.convention} pairing; "
                f"{self.image} and {self.label} -> float soft targets [batch, {self.num_classes}], on the delivery "
                "device after the copy")


def problem(s: MixSettings) -> tuple[str, Any, str] | None:
    """The first bad setting as (key, value, what is allowed), or None."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if not isinstance(s.num_classes, int) or isinstance(s.num_classes, bool) or s.num_classes < 1:
        return "num_classes", s.num_classes, "an integer >= 1 (the classes of the label field)"
    for key in ("mixup_alpha", "cutmix_alpha"):
        v = getattr(s, key)
        if not number(v) or not 0 <= v <= 1e3:
            return key, v, "a number >= 0 (0 turns it off)"
    for key in ("prob", "switch_prob", "label_smoothing"):
        v = getattr(s, key)
        if not number(v) or not 0 <= v <= 1:
            return key, v, "a number from 0 to 1"
    m = s.cutmix_minmax
    if m is not None and not (isinstance(m, tuple) and len(m) == 2 and all(map(number, m)) and 0 < m[0] < m[1] <= 1):
        return "cutmix_minmax", m, "null, or [min, max] shares of the image side with 0 < min < max <= 1"
    if s.mode not in MODES:
        return "mode", s.mode, "one of " + ", ".join(MODES)
    if s.convention not in CONVENTIONS:
        return "convention", s.convention, "one of " + ", ".join(CONVENTIONS)
    if s.convention == "torchvision" and (s.mode != "batch" or m is not None):
        return "convention", s.convention, "torchvision's MixUp/CutMix mix per batch without minmax: mode batch"
    if not isinstance(s.correct_lam, bool):
        return "correct_lam", s.correct_lam, "true or false"
    if s.mixup_alpha == 0 and s.cutmix == 0:
        return "mixup_alpha", s.mixup_alpha, "mixup_alpha > 0 or cutmix_alpha > 0 (or cutmix_minmax), else no mix"
    return None
