"""Batch-level mixup and cutmix as pure functions: draw a batch's parameters, mix its pixels, mix its targets.

The knobs are timm's ``timm.data.Mixup`` (same names, same defaults but ``num_classes``, which is
required): per ``mode`` a batch draws one (``batch``), one per pair of samples (``pair``: sample
``i`` and ``B - 1 - i`` exchange the same region or blend) or one per sample (``elem``) of:

- with probability ``prob`` a mix, else nothing (lambda 1);
- cutmix with probability ``switch_prob`` when both alphas are > 0 (only cutmix when only
  ``cutmix_alpha`` is, only mixup when only ``mixup_alpha`` is);
- lambda from Beta(alpha, alpha) of the chosen kind; a cutmix box from lambda (a square of side
  ``sqrt(1 - lambda)`` of the image's, centred uniformly, clipped to the image), or, with
  ``cutmix_minmax``, a rectangle whose sides are uniform in that share of the image's (timm then
  forces ``cutmix_alpha`` to 1); ``correct_lam`` sets lambda to the share of the image the box leaves.

Soft targets: ``one_hot(y) * (1 - smoothing) + smoothing / num_classes`` mixed with the
partner's by lambda (timm's ``mixup_target``). The partner of sample ``i`` is ``B - 1 - i``
(timm's ``flip``) under ``convention: timm``, and ``i - 1`` (torchvision's ``roll(1, 0)``) under
``convention: torchvision``, whose cutmix box is torchvision's (half-sides ``int(0.5 *
sqrt(1 - lambda) * W)`` around the centre, lambda always corrected). torchvision's current recipe,
``RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)])`` with ``CrossEntropyLoss(label_smoothing=0.1)``,
is ``{mixup_alpha: 0.2, cutmix_alpha: 1.0, switch_prob: 0.5, prob: 1.0, label_smoothing: 0.1,
convention: torchvision}`` with a plain soft-target cross entropy (smoothing a mixed one-hot target
by 0.1 gives exactly the target torch's loss smooths to).

An odd batch (``last_batch: partial``): timm asserts an even one; here the middle sample of a
``pair`` or ``elem`` batch is its own partner (``B - 1 - i == i``), so its pixels and its
(smoothed) target stay its own whatever lambda says; ``batch`` mode mixes it with itself likewise.
A batch of one is therefore unchanged but for label smoothing.

The draws come from any generator with NumPy's ``random``/``beta``/``integers`` (the loader's is
counter-based, :func:`feedfast.order.draws.batch_generator`), taken in timm's order, so a legacy
``np.random.RandomState`` seeded as timm's global one gives timm's parameters exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from feedfast.spec.batchmix_settings import MixSettings

try:
    from feedfast import _native
except ImportError:  # not built at install: torch mixes
    _native = None


class Generator(Protocol):
    """The part of ``np.random.Generator`` the draws use."""

    def random(self, size: int) -> np.ndarray: ...  # noqa: D102

    def beta(self, a: float, b: float, size: int) -> np.ndarray: ...  # noqa: D102

    def integers(self, low: int, high: int, size: int) -> np.ndarray: ...  # noqa: D102


@dataclass(frozen=True)
class MixParams:
    """One batch's draws: per sample its lambda (the weight of its own target), whether it is cut, its box
    (``[top, bottom, left, right)``, empty when not cut) and its partner."""

    lam: np.ndarray
    cut: np.ndarray
    boxes: np.ndarray
    partner: np.ndarray


def draw_params(s: MixSettings, rng: Generator, batch: int, height: int, width: int, *,
                enabled: bool = True) -> MixParams:
    """The parameters of a batch of ``batch`` images of ``height`` x ``width``, drawn in timm's order.

    ``enabled=False`` is timm's ``mixup_enabled = False``: no mix (every lambda 1, nothing cut), so the
    targets are each sample's own smoothed one-hot.
    """
    if s.convention == "torchvision":
        partner = (np.arange(batch) - 1) % batch
    else:
        partner = np.arange(batch)[::-1].copy()
    if not enabled:
        return MixParams(np.ones(batch), np.zeros(batch, dtype=bool), np.zeros((batch, 4), dtype=np.int64), partner)
    count = 1 if s.mode == "batch" else (batch // 2 if s.mode == "pair" else batch)
    lam, cut = _lambdas(s, rng, count, elem=s.mode != "batch")
    boxes = np.zeros((count, 4), dtype=np.int64)
    cut = cut & (lam != 1.0)  # timm leaves a sample whose lambda is 1 alone
    for i in np.flatnonzero(cut).tolist():
        boxes[i], lam[i] = _box(s, rng, float(lam[i]), height, width)
    if s.mode == "batch":
        lam, cut, boxes = (np.repeat(a, batch, axis=0) for a in (lam, cut, boxes))
    elif s.mode == "pair":  # sample B-1-i takes pair i's draws; an odd batch's middle sample is its own pair
        mid = np.ones(batch % 2, dtype=lam.dtype)
        lam = np.concatenate([lam, mid, lam[::-1]])
        cut = np.concatenate([cut, np.zeros(batch % 2, dtype=bool), cut[::-1]])
        boxes = np.concatenate([boxes, np.zeros((batch % 2, 4), dtype=np.int64), boxes[::-1]])
    own = partner == np.arange(batch)  # an odd batch's middle sample (or a batch of one) stays exactly itself
    lam[own], cut[own], boxes[own] = 1.0, False, 0
    return MixParams(lam, cut, boxes, partner)


def _lambdas(s: MixSettings, rng: Generator, count: int, elem: bool) -> tuple[np.ndarray, np.ndarray]:
    """timm's ``_params_per_elem`` (float32 lambdas) or ``_params_per_batch`` (one float64 lambda)."""
    both = s.mixup_alpha > 0 and s.cutmix > 0
    if elem:
        cut = rng.random(count) < s.switch_prob if both else np.full(count, s.mixup_alpha == 0)
        if both:
            lam_mix = np.where(cut, rng.beta(s.cutmix, s.cutmix, count), rng.beta(s.mixup_alpha, s.mixup_alpha, count))
        else:
            alpha = s.mixup_alpha or s.cutmix
            lam_mix = rng.beta(alpha, alpha, count)
        lam = np.where(rng.random(count) < s.prob, lam_mix.astype(np.float32), np.float32(1.0)).astype(np.float32)
        return lam, cut
    if not rng.random(1)[0] < s.prob:
        return np.ones(1), np.zeros(1, dtype=bool)
    cut_one = bool(rng.random(1)[0] < s.switch_prob) if both else s.mixup_alpha == 0
    alpha = s.cutmix if cut_one else s.mixup_alpha
    return rng.beta(alpha, alpha, 1).astype(np.float64), np.array([cut_one])


def _box(s: MixSettings, rng: Generator, lam: float, h: int, w: int) -> tuple[list[int], float]:
    """A cutmix box ``[top, bottom, left, right]`` and the lambda it leaves (timm's or torchvision's rule)."""
    if s.convention == "torchvision":
        cx, cy = int(rng.integers(0, w, 1)[0]), int(rng.integers(0, h, 1)[0])
        r = 0.5 * np.sqrt(1.0 - lam)
        rw, rh = int(r * w), int(r * h)
        x1, y1, x2, y2 = max(cx - rw, 0), max(cy - rh, 0), min(cx + rw, w), min(cy + rh, h)
        return [y1, y2, x1, x2], float(1.0 - (x2 - x1) * (y2 - y1) / (w * h))
    if s.cutmix_minmax is not None:
        lo, hi = s.cutmix_minmax
        ch, cw = int(rng.integers(int(h * lo), int(h * hi), 1)[0]), int(rng.integers(int(w * lo), int(w * hi), 1)[0])
        top, left = int(rng.integers(0, h - ch + 1, 1)[0]), int(rng.integers(0, w - cw + 1, 1)[0])
        box = [top, top + ch, left, left + cw]
    else:
        ratio = np.sqrt(1 - lam)
        ch, cw = int(h * ratio), int(w * ratio)
        cy, cx = int(rng.integers(0, h, 1)[0]), int(rng.integers(0, w, 1)[0])
        box = [int(np.clip(cy - ch // 2, 0, h)), int(np.clip(cy + (ch + 1) // 2, 0, h)),
               int(np.clip(cx - cw // 2, 0, w)), int(np.clip(cx + (cw + 1) // 2, 0, w))]
    if s.correct_lam or s.cutmix_minmax is not None:
        lam = 1.0 - (box[1] - box[0]) * (box[3] - box[2]) / float(h * w)
    return box, lam


def weights(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's own weight and its partner's, float32, with ``1 - lambda`` taken in lambda's dtype (timm's)."""
    return np.ascontiguousarray(lam, dtype=np.float32), np.ascontiguousarray(1.0 - lam).astype(np.float32)


def _weights(lam: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    keep, take = weights(lam)
    return torch.from_numpy(keep).to(device), torch.from_numpy(take).to(device)


def mix_into(images: torch.Tensor, params: MixParams, chw: bool) -> bool:
    """A batch's mixup / cutmix (:func:`mix_images`) in place, in this thread, without
    torch's thread pool; False (nothing done) when feedfast's C extension is not built or not a contiguous float32 or uint8 CPU batch.

    Args:
        images: the batch, a ``torch.Tensor`` ``[B, C, H, W]`` (``chw``) or ``[B, H, W, C]``.
        params: its :class:`MixParams`.
    """
    if (_native is None or images.device.type != "cpu" or images.dim() != 4 or not images.is_contiguous()
            or images.dtype not in (torch.float32, torch.uint8) or images.requires_grad):
        return False
    keep, take = weights(params.lam)
    action = np.where(params.cut, 2, np.where(params.lam != 1.0, 1, 0)).astype(np.uint8)
    boxes = np.ascontiguousarray(params.boxes, dtype=np.int64)
    partner = np.ascontiguousarray(params.partner, dtype=np.int64)
    _native.mix_into(images.numpy(), keep, take, action, boxes, partner, chw)
    return True


def mix_images(images: torch.Tensor, p: MixParams, layout: str = "CHW", *, inplace: bool = False) -> torch.Tensor:
    """The batch's images mixed: cut samples take their box from the partner, the others blend.

    ``images`` is ``[B, C, H, W]`` (``layout`` CHW) or ``[B, H, W, C]`` (HWC); an integer batch blends in
    float32 and is rounded back (timm's ``FastCollateMixup``). Every source is read before anything is
    written, so ``inplace`` (the loader's own batch) writes into ``images``; otherwise a new tensor.
    In place on the CPU (a contiguous float32 or uint8 batch) the C extension does the same arithmetic
    in the calling thread (:func:`mix_into`): torch's CPU kernels would run it
    on torch's thread pool, against the decoding threads for the same cores.
    """
    if inplace and mix_into(images, p, layout == "CHW"):
        return images
    blend = np.flatnonzero(~p.cut & (p.lam != 1.0))
    if inplace and blend.size == len(images) and images.dtype.is_floating_point:
        return _blend_all_in_place(images, p)
    blended = _blend(images, p, blend) if blend.size else None
    patches = _patches(images, p, layout)
    if blended is not None and blend.size == len(images):  # every sample blends (batch mode's mixup)
        return images.copy_(blended) if inplace else blended
    out = images if inplace else images.clone()
    if blended is not None:
        out.index_copy_(0, torch.from_numpy(blend).to(images.device), blended)
    for rows, (top, bottom, left, right), source in patches:
        region = out[:, :, top:bottom, left:right] if layout == "CHW" else out[:, top:bottom, left:right]
        region[rows] = source
    return out


def _blend(images: torch.Tensor, p: MixParams, rows: np.ndarray) -> torch.Tensor:
    """``rows`` blended with their partners: ``own * lambda + partner * (1 - lambda)`` (timm's operations)."""
    device = images.device
    keep, take = _weights(p.lam[rows], device)
    shape = (-1,) + (1,) * (images.dim() - 1)
    own = images.index_select(0, torch.from_numpy(rows).to(device))
    other = images.index_select(0, torch.from_numpy(p.partner[rows]).to(device))
    if not images.dtype.is_floating_point:
        mixed = own.float().mul_(keep.view(shape)).add_(other.float().mul_(take.view(shape)))
        return torch.round(mixed).to(images.dtype)
    return own.mul_(keep.view(shape).to(images.dtype)).add_(other.mul_(take.view(shape).to(images.dtype)))


def _blend_all_in_place(images: torch.Tensor, p: MixParams) -> torch.Tensor:
    """Every sample blended with its partner in ``images`` itself: :func:`_blend`'s arithmetic with one copy of
    the batch (the partners', read before anything is written) where it takes two and a copy back."""
    device = images.device
    keep, take = _weights(p.lam, device)
    shape = (-1,) + (1,) * (images.dim() - 1)
    other = images.index_select(0, torch.from_numpy(p.partner).to(device)).mul_(take.view(shape).to(images.dtype))
    return images.mul_(keep.view(shape).to(images.dtype)).add_(other)


def _patches(images: torch.Tensor, p: MixParams, layout: str) -> list[tuple[torch.Tensor, tuple[int, ...], torch.Tensor]]:
    """Per distinct box of the cut samples: their rows, the box, and their partners' pixels in it (read now)."""
    cut = np.flatnonzero(p.cut)
    if not cut.size:
        return []
    boxes, group = np.unique(p.boxes[cut], axis=0, return_inverse=True)
    out: list[tuple[torch.Tensor, tuple[int, ...], torch.Tensor]] = []
    for g, box in enumerate(boxes.tolist()):
        rows = cut[group.reshape(-1) == g]
        top, bottom, left, right = box
        region = images[:, :, top:bottom, left:right] if layout == "CHW" else images[:, top:bottom, left:right]
        source = region.index_select(0, torch.from_numpy(p.partner[rows]).to(images.device))
        out.append((torch.from_numpy(rows).to(images.device), (top, bottom, left, right), source))
    return out


def soft_targets(labels: torch.Tensor, p: MixParams, num_classes: int, smoothing: float) -> torch.Tensor:
    """Float32 ``[B, num_classes]``: each sample's smoothed one-hot target and its partner's, mixed by lambda.

    Raises:
        ValueError: a label outside ``[0, num_classes)`` (the message gives the range found).
    """
    labels = labels.reshape(-1).long()
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels run from {int(labels.min())} to {int(labels.max())}, outside the "
                         f"{num_classes} classes (num_classes)")
    off = smoothing / num_classes
    on = 1.0 - smoothing + off
    if labels.device.type == "cpu":  # NumPy, in this thread: torch's CPU kernels would wake its thread pool
        keep_np, take_np = weights(p.lam)
        hot = np.full((labels.numel(), num_classes), off, dtype=np.float32)
        hot[np.arange(labels.numel()), labels.numpy()] = np.float32(on)
        return torch.from_numpy(hot * keep_np[:, None] + hot[p.partner] * take_np[:, None])
    one_hot = torch.full((labels.numel(), num_classes), off, device=labels.device)
    one_hot.scatter_(1, labels.view(-1, 1), on)
    keep, take = _weights(p.lam, labels.device)
    partner = torch.from_numpy(p.partner).to(labels.device)
    return one_hot * keep[:, None] + one_hot[partner] * take[:, None]
