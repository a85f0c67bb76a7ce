"""The spec reference, generated from the op registry so docs and validation cannot drift.

``python -m feedfast.spec.reference > docs/spec-reference.md`` rewrites the page; a test
checks that the committed page equals this output.
"""

from __future__ import annotations

from feedfast.ops.base import REQUIRED, OpDef, Param
from feedfast.ops.registry import OPS
from feedfast.spec import model as m

HEADER = """# Spec reference

Generated from the op registry (`feedfast/ops/registry.py`) by
`python -m feedfast.spec.reference`; do not edit by hand.

## Top-level keys

| key | allowed | default |
|---|---|---|
| `version` | `1` | `1` |
| `name` | a string | the file's name |
| `source.components.NAME` | `{{ext: "jpg;jpeg", kind: ...}}`, kind one of {kinds} | `image` (jpg;jpeg;png) and `label` (cls) |
| `source.missing` | {missing} | `error` |
| `source.on_error` | {on_error} | `raise` |
| `source.check_seconds` | a number of seconds, 0.05 to 600 (CPU time per image check, and per decode of a suspect image under `raise`; over it, the image is bad) | `2` |
| `pipeline.FIELD` | a list of ops, or `{{from: COMPONENT, ops: [...]}}` | (required) |
| `outputs` | a list of fields (tuple batches) or a mapping (dict batches) | every field, in order |
| `batch.size` | an integer >= 1 | `64` |
| `batch.last_batch` | {last} | `partial` |
| `batch.mix.num_classes` | an integer >= 1: batch-level mixup / cutmix (timm's `Mixup` knobs below), the label output becomes float soft targets `[batch, num_classes]`, mixed on the delivery device after the copy | (required with `batch.mix`) |
| `batch.mix.mixup_alpha`, `batch.mix.cutmix_alpha` | numbers >= 0 (Beta(alpha, alpha); 0 turns that kind off) | `1.0`, `0.0` |
| `batch.mix.cutmix_minmax` | null, or `[min, max]` shares of the image side (cutmix alpha is then 1) | `null` |
| `batch.mix.prob`, `batch.mix.switch_prob` | numbers from 0 to 1 (mix at all; cutmix rather than mixup when both alphas are > 0) | `1.0`, `0.5` |
| `batch.mix.mode` | `batch`, `pair`, `elem` (one draw per batch, per pair `i`, `B-1-i`, per sample; an odd batch's middle sample stays itself) | `batch` |
| `batch.mix.correct_lam` | true or false (lambda from the clipped box's area) | `true` |
| `batch.mix.label_smoothing` | a number from 0 to 1 | `0.1` |
| `batch.mix.convention` | `timm` (partner `B-1-i`, timm's box) or `torchvision` (partner `i-1`, v2 `CutMix`'s box; mode `batch`) | `timm` |
| `batch.mix.image`, `batch.mix.label` | output fields (the image and label outputs mixed) | the only image output, the only label output |
| `shuffle.buffer` | an integer >= 0 (samples) | `0` |
| `shuffle.shards` | true or false | `false` |
| `shuffle.block` | an integer >= 1 (samples; remote shards, shuffled: each window spread over about this many, held in memory) | `16384` |
| `shuffle.window` | an integer from 1 to `shuffle.block` (consecutive samples of a shard read in one request) | `32` |
| `shuffle.repeats` | an integer from 1 to 64: repeated augmentation (DeiT's RASampler), each sample this many times in a row of the epoch's permutation, copies on different ranks, each with its own draws; the epoch keeps the dataset's length; needs the global order (shuffled, local shards or the threads and pil backends) | `1` |
| `device` | {devices} | `auto` |
| `seed` | an integer | `0` |
| `decoder.KEY` | see [Decoder](#decoder-gpu) | NVIDIA's ImageNet values |
| `loader.threads` | an integer from 1 to 1024 (the DataLoader's `num_workers` when it is not given) | all usable cores |
| `loader.prefetch` | an integer from 1 to 64 (`prefetch_factor` when not given) | `2` |
| `loader.backend` | `auto`, `dali`, `threads`, `pil` (`backend` when not given) | `auto` |
| `tune.enabled` | true or false (`tune` when not given: search threads and batches ahead while training) | `false` |
| `tune.budget` | a share of the first epoch in (0, 1] (the search's batches, at least 8) | `0.1` |

Every op also takes `device: auto | cpu | gpu`, overriding the pipeline's placement for it.

## Ops
"""


def _default(p: Param) -> str:
    if p.default is REQUIRED:
        return "(required)"
    v = list(p.default) if isinstance(p.default, tuple) else p.default
    return f"`{v!r}`" if not isinstance(v, list) else "`[" + ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) + "]`"


def render_op(op: OpDef) -> str:
    """One op's section: what it does, where it runs, its parameters."""
    where = "host, after the DALI graph" if op.host else ", ".join(op.devices)
    lines = [f"### `{op.name}`", "", f"{op.doc}.", "", f"DALI: `{op.dali_name}`; runs on: {where}; "
             f"random: {'yes' if op.random else 'no'}; PIL backend: {'yes' if op.pil else 'no'}.", ""]
    if op.params:
        lines += ["| parameter | meaning | allowed | default |", "|---|---|---|---|"]
        lines += [f"| `{p.name}` | {p.doc} | {p.allowed()} | {_default(p)} |" for p in op.params]
    else:
        lines.append("No parameters.")
    return "\n".join(lines) + "\n"


DECODER_HEAD = """## Decoder (GPU)

The `decoder` section tunes DALI's `mixed` decoder (nvJPEG through nvImageCodec), which every
GPU-placed `decode` uses, fused or not. Its keys are DALI's own argument names, passed only
on the `mixed` device: a CPU-placed decode never receives them, and `feedfast plan --json`
shows them on each `mixed` node. Leave the section out to get the defaults below.

```yaml
decoder: {hw_decoder_load: 0.75}   # any key left out keeps its default
```
"""

DECODER_SOURCES = """Where the defaults come from:

- `device_memory_padding`, `host_memory_padding`, `preallocate_width_hint`,
  `preallocate_height_hint`: NVIDIA's DALI ResNet-50 training example,
  `docs/examples/use_cases/pytorch/resnet50/main.py` in github.com/NVIDIA/DALI (the version
  with preallocation hints): 211025920 and 140544512 bytes "for the biggest sample in
  ImageNet", 5980 x 6430 "for the biggest image in the data set", all on `mixed` only.
- `hw_decoder_load`: 0.65, DALI's own default for `decoders.image` (DALI operator reference,
  which says the best share depends on the pipeline's threads and is found by trying).
  NVIDIA's published A100 decoding figure (about 7,000 images/s, quoted in DALI issue #5362)
  was taken with 0.75, so 0.65 to 0.75 is the range to try. No H100/H200 figure is
  published, and feedfast has not measured one yet.

The hints size the hardware decoder's buffers for ImageNet's largest image; on a GPU with
little memory, or for a dataset of small images, smaller hints (or 0: no preallocation) save
memory. The hardware JPEG decoder exists on A100, H100 and H200; on GPUs without one (V100,
consumer GPUs) `hw_decoder_load` does nothing.
"""


def render_decoder() -> str:
    """The ``decoder`` section's keys, their defaults and where the defaults come from."""
    rows = ["| key | meaning | allowed | default |", "|---|---|---|---|"]
    rows += [f"| `decoder.{p.name}` | {p.doc} | {p.allowed()} | {_default(p)} |" for p in m.DECODER_PARAMS]
    return DECODER_HEAD + "\n" + "\n".join(rows) + "\n\n" + DECODER_SOURCES


def render_reference() -> str:
    """The whole reference page as Markdown."""
    quote = lambda xs: ", ".join(f"`{x}`" for x in xs)  # noqa: E731
    head = HEADER.format(kinds=quote(m.COMPONENT_KINDS), missing=quote(m.MISSING_POLICIES),
                         on_error=quote(m.ON_ERROR_POLICIES), last=quote(m.LAST_BATCH_POLICIES), devices=quote(m.DEVICES))
    return head + "\n" + "\n".join(render_op(op) for op in OPS.values()) + "\n" + render_decoder()


if __name__ == "__main__":
    print(render_reference(), end="")
