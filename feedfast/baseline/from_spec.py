"""The baselines' settings read from a feedfast spec: the same crop, flip, statistics and components."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from feedfast.baseline.torch_recipe import IMAGENET_MEAN, IMAGENET_STD, TorchRecipe
from feedfast.errors import UserError


@dataclass(frozen=True)
class BaselineSettings:
    """What a baseline needs from a spec.

    Attributes:
        recipe: the ImageNet-style transforms with the spec's parameters.
        image_ext: the image component's ``;``-separated extensions.
        label_ext: the label component's extension.
        shuffle: whether the spec shuffles samples (the baselines then shuffle too).
        seed: the spec's seed.
        mix: the spec's ``batch.mix`` (the torch baseline mixes as torchvision's reference collates:
            ``RandomChoice([MixUp, CutMix])``), or None.
        left_out: the spec's image ops the torch baseline does not run (its description names them).
    """

    recipe: TorchRecipe
    image_ext: str
    label_ext: str
    shuffle: bool
    seed: int
    mix: Any = None
    left_out: tuple[str, ...] = ()


FOLLOWED = frozenset({"decode", "random_resized_crop", "center_crop", "resize", "flip", "normalize",
                      "trivial_augment_wide", "random_erasing"})
"""The image ops whose torchvision form the torch baseline runs (TorchRecipe); others are named as left out."""


def _side(size: Any) -> int:
    """The height of an ``int`` or ``[height, width]`` size (the baselines crop squares)."""
    return int(size if isinstance(size, int) else size[0])


def settings_from_spec(spec: Any) -> BaselineSettings:
    """The baseline settings matching ``spec``'s image and label fields.

    Raises:
        UserError: the spec has no image field with ``random_resized_crop`` or ``center_crop``,
            or no label field.
    """
    image = next((f for f in spec.fields.values() if {"random_resized_crop", "center_crop"} & {o.op for o in f.ops}),
                 None)
    label = next((f for f in spec.fields.values() if any(o.op == "label" for o in f.ops)), None)
    if image is None or label is None:
        raise UserError("--compare needs an image field with random_resized_crop (train) or center_crop (val) and "
                        "a label field, as pipelines/imagenet-train.yaml and imagenet-val.yaml have")
    ops = {o.op: o.params for o in image.ops}
    norm = ops.get("normalize", {})
    mean, std = tuple(norm.get("mean", IMAGENET_MEAN)), tuple(norm.get("std", IMAGENET_STD))
    left_out = tuple(dict.fromkeys(o.op for o in image.ops if o.op not in FOLLOWED))
    if "random_resized_crop" in ops:
        p = ops["random_resized_crop"]
        recipe = TorchRecipe(train=True, size=_side(p["size"]), scale=tuple(p["scale"]), ratio=tuple(p["ratio"]),
                             flip_p=float(ops.get("flip", {}).get("horizontal", 0.0)), mean=mean, std=std,
                             trivial_augment="trivial_augment_wide" in ops,
                             random_erasing=float(ops.get("random_erasing", {}).get("probability", 0.0)))
    else:
        resize = ops.get("resize", {}).get("size", 256)
        recipe = TorchRecipe(train=False, size=_side(ops["center_crop"]["size"]), resize=_side(resize), mean=mean,
                             std=std)
    return BaselineSettings(recipe=recipe, image_ext=spec.components[image.source].ext,
                            label_ext=spec.components[label.source].ext, shuffle=(spec.shuffle_buffer or 0) > 0,
                            seed=int(spec.seed or 0), mix=spec.mix, left_out=left_out)
