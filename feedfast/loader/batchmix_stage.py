"""The spec's ``batch.mix`` run on a finished batch, on the delivery device after the copy.

One call in the delivery stage (:meth:`feedfast.loader.deliver.Delivery.stage`, after the upload
and before the batch hook), for every backend: :meth:`BatchMix.__call__` draws the batch's
parameters from a counter-based generator keyed by (seed, epoch, rank, world, step)
(:func:`feedfast.order.draws.batch_generator`), mixes the image field in place and replaces the
label field by float soft targets ``[batch, num_classes]`` (:mod:`feedfast.ops.batchmix`), on
the ring's side stream, and records the event the training stream waits for. Padded samples
(``last_batch: pad``) are mixed as any other; ``sample_info``'s mask still marks them.
"""

from __future__ import annotations

from feedfast.compile.plan import Plan
from feedfast.errors import FeedfastError
from feedfast.loader.deliver import Delivered
from feedfast.loader.devices import NullEvent
from feedfast.loader.ring import PinnedRing
from feedfast.ops.batchmix import MixSettings, draw_params, mix_images, soft_targets
from feedfast.order.draws import batch_generator
from feedfast.spec.model import Spec


class BatchMix:
    """Mixup / cutmix over one rank's batches (see the module docstring).

    Args:
        settings: the spec's ``batch.mix`` (its ``image`` and ``label`` name output fields).
        layout: the image field's layout, ``CHW`` or ``HWC``.
        seed, rank, world: the loader's; with the epoch and step they key each batch's draws.
    """

    def __init__(self, settings: MixSettings, *, layout: str, seed: int, rank: int, world: int) -> None:
        self.settings, self.layout = settings, layout
        self.seed, self.rank, self.world = seed, rank, world
        self.enabled = True
        """False: batches are not mixed, and their targets are their own smoothed one-hot (timm's
        ``mixup_enabled = False``, which its ``--mixup-off-epoch`` sets)."""

    def __call__(self, delivered: Delivered, ring: PinnedRing, epoch: int, step: int) -> None:
        """Mix ``delivered`` (uploaded, not yet handed over): its image field mixed, its label field soft
        targets, and its event recorded after that work on the ring's stream."""
        s = self.settings
        images, labels = delivered.fields[s.image], delivered.fields[s.label]
        h, w = (images.shape[2], images.shape[3]) if self.layout == "CHW" else (images.shape[1], images.shape[2])
        params = draw_params(s, batch_generator(self.seed, epoch, self.rank, self.world, step), images.shape[0], h, w,
                             enabled=self.enabled)
        with ring.layer.on(ring.stream):
            try:
                soft = soft_targets(labels, params, s.num_classes, s.label_smoothing)
            except ValueError as exc:
                raise FeedfastError(f"batch.mix: epoch {epoch}, batch {step}: {exc}; set num_classes to the "
                                    "number of classes (or fix the labels' offset)") from exc
            mixed = mix_images(images, params, self.layout, inplace=True)  # the batch's own tensor
            event = ring.layer.new_event() if ring.cuda else NullEvent()
            event.record(ring.stream)
        delivered.fields[s.image], delivered.fields[s.label] = mixed, soft
        delivered.event = event


def mix_stage(spec: Spec, plan: Plan, *, rank: int, world: int) -> BatchMix | None:
    """The loader's :class:`BatchMix` for a spec with ``batch.mix``, else None."""
    if spec.mix is None:
        return None
    layout = plan.nodes[plan.outputs[spec.mix.image]].sig.layout
    return BatchMix(spec.mix, layout=layout, seed=spec.seed, rank=rank, world=world)
