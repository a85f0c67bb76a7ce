"""The C plan of a batch's image geometry equals the threaded path's Python walk, sample for sample."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from feedfast.compile.pil import compile_pil
from feedfast.loader.backends.cpu import batchplan
from feedfast.loader.backends.cpu.pil_fast import jpeg_header
from feedfast.loader.backends.cpu.thread_sample import NeedsFallback, View, _geometry, draft_factor, region_needed
from feedfast.order.draws import batch_draws, draws_key
from feedfast.spec import load_spec

pytestmark = pytest.mark.skipif(batchplan.ext is None, reason="feedfast._plan is not built")


def _spec(image: list[Any]) -> Any:
    return load_spec({"version": 1, "name": "t", "pipeline": {"image": image, "label": ["label"]},
                      "outputs": ["image", "label"], "batch": {"size": 4}})


def _jpeg(w: int, h: int, mode: str = "RGB", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    shape = (h, w, 3) if mode == "RGB" else (h, w)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode).save(buf, "JPEG")
    return buf.getvalue()


def _python_walk(program: Any, raw: bytes, rng: Any) -> dict[str, Any] | str:
    """What thread_sample's walk decides for the image chain: the view, DCT factor and region (or why not)."""
    steps = {s.id: s for s in program.steps}
    header = jpeg_header(raw)
    if header is None:
        return "not-region"
    view: View | None = None
    for step in program.steps:
        if step.op == "decode":
            target = "L" if step.params["color"] == "gray" else "RGB"
            if header.mode != target:
                return "not-region"
            w, h = header.size
            view = View(step.id, (0.0, 0.0, float(w), float(h)), header.size, (0, 0, w, h))
        elif step.op in ("random_resized_crop", "resize", "center_crop"):
            assert view is not None
            try:
                view = _geometry(step, view, rng)
            except NeedsFallback:
                return "fallback"
        elif step.op == "flip":
            assert view is not None
            hf = rng.random() < step.params["horizontal"]
            vf = rng.random() < step.params["vertical"]
            view = View(view.source, view.box, view.size, view.clip, view.resample, view.hflip ^ hf, view.vflip ^ vf)
    assert view is not None and steps
    factor = draft_factor(view)
    w, h = header.size
    region = region_needed([view], float(factor), (-(-w // factor), -(-h // factor)))
    return {"view": view, "factor": factor, "region": region}


CHAINS = [
    ["decode", {"random_resized_crop": {"size": 224}}, {"flip": {"horizontal": 0.5}}, "normalize"],
    ["decode", {"random_resized_crop": {"size": [32, 48], "scale": [0.5, 1.0], "ratio": [0.5, 2.0],
                                        "interpolation": "cubic"}}, {"flip": {"horizontal": 0.5, "vertical": 0.5}}],
    ["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}, "normalize"],
    ["decode", {"resize": {"size": [30, 20], "interpolation": "lanczos"}}],
    ["decode", {"center_crop": {"size": 64}}, {"resize": {"size": [16, 16]}}],
    [{"decode": {"color": "gray"}}, {"random_resized_crop": {"size": 16}}],
    ["decode", {"center_crop": {"size": [10, 300]}}],
]


@pytest.mark.parametrize("chain", CHAINS, ids=range(len(CHAINS)))
def test_the_plan_equals_the_python_walk(chain: list[Any]) -> None:
    program = compile_pil(_spec(chain))
    plan_chain = batchplan.chain_of(program)
    assert plan_chain is not None
    raws = [_jpeg(w, h, mode, seed) for seed, (w, h, mode) in enumerate(
        [(500, 375, "RGB"), (64, 64, "RGB"), (1, 1, "RGB"), (37, 999, "RGB"), (300, 20, "L"), (2000, 1500, "RGB"),
         (17, 13, "L"), (224, 224, "RGB")] * 4)]
    png = io.BytesIO()
    Image.new("RGB", (30, 30)).save(png, "PNG")
    raws += [png.getvalue(), b"", b"\xff\xd8\xffgarbage"]
    samples = np.arange(len(raws), dtype=np.int64) * 7919 + 3
    key = draws_key(5, 2)
    rows = batchplan.plan(plan_chain, raws, samples, key, Image.MAX_IMAGE_PIXELS)
    draws = batch_draws(seed=5, epoch=2, samples=samples)
    for i, raw in enumerate(raws):
        want = _python_walk(program, raw, draws[i].replay())
        row = rows[i]
        if want == "not-region":
            assert row[batchplan.STATUS] == batchplan.NOT_REGION, i
            continue
        if want == "fallback":
            assert row[batchplan.STATUS] == batchplan.FALLBACK, i
            continue
        assert isinstance(want, dict)
        assert row[batchplan.STATUS] == batchplan.OK, i
        view = want["view"]
        assert tuple(row[batchplan.BOX:batchplan.BOX + 4]) == view.box, i
        assert tuple(row[batchplan.SIZE:batchplan.SIZE + 2]) == view.size, i
        assert tuple(row[batchplan.CLIP:batchplan.CLIP + 4]) == view.clip, i
        assert row[batchplan.RESAMPLE] == (-1 if view.resample is None else int(view.resample)), i
        assert (bool(row[batchplan.HFLIP]), bool(row[batchplan.VFLIP])) == (view.hflip, view.vflip), i
        assert row[batchplan.FACTOR] == want["factor"], i
        assert tuple(row[batchplan.REGION:batchplan.REGION + 4]) == want["region"], i


def test_many_draws_agree_past_the_precomputed_ones() -> None:
    """A crop that retries (a tiny scale range on a thin image) draws past the 32 computed ahead."""
    chain = ["decode", {"random_resized_crop": {"size": 8, "scale": [0.9, 1.0], "ratio": [3.0, 4.0]}}]
    program = compile_pil(_spec(chain))
    plan_chain = batchplan.chain_of(program)
    assert plan_chain is not None
    raws = [_jpeg(8, 200, seed=s) for s in range(6)]
    samples = np.arange(6, dtype=np.int64)
    rows = batchplan.plan(plan_chain, raws, samples, draws_key(0, 0), None)
    draws = batch_draws(seed=0, epoch=0, samples=samples)
    for i, raw in enumerate(raws):
        want = _python_walk(program, raw, draws[i].replay())
        assert isinstance(want, dict)
        assert tuple(rows[i, batchplan.BOX:batchplan.BOX + 4]) == want["view"].box


def test_programs_the_plan_cannot_take_go_the_python_way() -> None:
    assert batchplan.chain_of(compile_pil(_spec(["decode", {"random_resized_crop": {"size": 8}}, {"color_jitter": {"brightness": 0.4}}]))) is None


def test_a_huge_header_is_left_to_pillow_s_rules() -> None:
    program = compile_pil(_spec(["decode", {"resize": {"size": [8, 8]}}]))
    plan_chain = batchplan.chain_of(program)
    assert plan_chain is not None
    raw = _jpeg(64, 64)
    rows = batchplan.plan(plan_chain, [raw, raw], np.arange(2), 1, 64 * 64 - 1)
    assert rows[0, batchplan.STATUS] == batchplan.LARGE
    rows = batchplan.plan(plan_chain, [raw], np.arange(1), 1, 64 * 32 - 1)
    assert rows[0, batchplan.STATUS] == batchplan.BOMB


# --- the planned threaded path gives the Python walk's batches --------------------------------

END_TO_END = [
    ["decode", {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5, "vertical": 0.3}}],
    ["decode", {"random_resized_crop": {"size": [20, 28], "interpolation": "cubic"}}, "flip",
     {"normalize": {"dtype": "float16", "layout": "HWC"}}],
    [{"decode": {"color": "gray"}}, {"resize": {"size": [20, 28]}}, {"normalize": {"mean": [0.5], "std": [0.25]}}],
    ["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}, "normalize"],
    ["decode", {"random_resized_crop": {"size": 8, "interpolation": "lanczos"}}, "flip", "normalize"],
    ["decode", {"center_crop": {"size": [24, 30]}}, {"flip": {"horizontal": 0.5, "vertical": 0.5}}, "normalize"],
    [{"decode": {"color": "gray"}}, {"center_crop": {"size": 20}}],
]


@pytest.mark.parametrize("chain", END_TO_END, ids=["rrc-flip-uint8", "rrc-cubic-fp16-hwc", "gray-resize",
                                                   "resize-crop", "rrc-lanczos-reduced", "crop-flip", "gray-crop"])
def test_planned_batches_equal_the_python_walk(shards: list[str], chain: list[Any],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Bit for bit: the plan with Pillow's resize, the plan with the extension's one call, and no plan."""
    from feedfast import _env
    from feedfast.compile.build import build_plan
    from feedfast.loader.backends.cpu import native
    from feedfast.loader.backends.cpu.threads import run_thread_epoch
    from feedfast.order.deal import plan_epoch
    from feedfast.sources.dataset import open_shards

    spec = load_spec({"pipeline": {"image": chain, "label": ["label"]}, "outputs": ["image", "label"],
                      "batch": {"size": 4}, "seed": 3, "shuffle": {"buffer": 64, "shards": True}})
    sset = open_shards(shards, spec, _env.cache_dir())

    def run() -> list[Any]:
        ep = plan_epoch(list(sset.sizes), batch_size=4, rank=0, world=1, last_batch=spec.last_batch, seed=3, epoch=1,
                        shuffle_shards=spec.shuffle_shards)
        return list(run_thread_epoch(build_plan(spec, device="cpu"), sset, ep, rank=0, world=1, batch_size=4,
                                     workers=2, seed=3, epoch=1))

    ways = {}
    for name, one_call, built in (("pillow", False, batchplan.ext), ("one call", True, batchplan.ext),
                                  ("walk", False, None)):
        if one_call and native.resample_flavour() is None:
            continue  # this Pillow's resize is not the extension's: the one call is never used here
        monkeypatch.setattr(batchplan, "ONE_CALL", one_call)
        monkeypatch.setattr(batchplan, "ext", built)
        ways[name] = run()
    walk = ways.pop("walk")
    for name, batches in ways.items():
        assert len(batches) == len(walk)
        for a, b in zip(batches, walk):
            assert a.origins == b.origins
            assert torch.equal(a.fields["label"], b.fields["label"])
            assert torch.equal(a.fields["image"], b.fields["image"]), name


# --- the C consumers take any contiguous buffer: a remote window's slices, without a copy each -----------


def _buffers(raws: list[bytes]) -> dict[str, list[Any]]:
    """``raws`` as each kind of buffer a caller may hand over, the JPEGs inside a larger block as a fetched
    window holds them (memoryview and NumPy slices of one bytes object, bytearrays)."""
    window = b"".join(raws)
    starts = np.cumsum([0] + [len(r) for r in raws]).tolist()
    array = np.frombuffer(window, dtype=np.uint8)
    return {"bytes": list(raws),
            "memoryview": [memoryview(window)[a:b] for a, b in zip(starts, starts[1:])],
            "numpy": [array[a:b] for a, b in zip(starts, starts[1:])],
            "bytearray": [bytearray(r) for r in raws]}


SMALL = ["decode", {"random_resized_crop": {"size": [12, 16]}}, {"flip": {"horizontal": 0.5}}]


def test_plan_batch_reads_any_contiguous_buffer_as_it_reads_bytes() -> None:
    plan_chain = batchplan.chain_of(compile_pil(_spec(SMALL)))
    assert plan_chain is not None
    raws = [_jpeg(64 + 9 * i, 48 + 5 * i, seed=i) for i in range(5)]
    got = {kind: batchplan.plan(plan_chain, [*items, None], np.arange(len(raws) + 1), draws_key(1, 0), None)
           for kind, items in _buffers(raws).items()}
    assert (got["bytes"][:-1, batchplan.STATUS] == batchplan.OK).all()
    assert got["bytes"][-1, batchplan.STATUS] != batchplan.OK  # None: no such member, the Python way says so
    for kind, rows in got.items():
        np.testing.assert_array_equal(rows, got["bytes"], err_msg=kind)


def test_sample_batch_makes_the_same_pixels_from_any_contiguous_buffer() -> None:
    from feedfast.loader.backends.cpu import native
    from feedfast.loader.backends.cpu.pil_fast import REGION_MARGIN
    from feedfast.loader.backends.cpu.thread_sample import REDUCING_GAP

    flavour = native.resample_flavour()
    if native.ext is None or flavour is None:
        pytest.skip("feedfast._native is not built here")
    plan_chain = batchplan.chain_of(compile_pil(_spec(SMALL)))
    assert plan_chain is not None
    raws = [_jpeg(64 + 9 * i, 48 + 5 * i, seed=i) for i in range(5)]
    plans = batchplan.plan(plan_chain, raws, np.arange(len(raws)), draws_key(1, 0), None)
    made = {}
    for kind, items in _buffers(raws).items():
        batch = np.zeros((len(items), 12, 16, 3), dtype=np.uint8)
        done = np.zeros(len(items), dtype=np.int8)
        native.ext.sample_batch(items, plans, done, batch[0], batch, None, None, False, False, REGION_MARGIN,
                                flavour, REDUCING_GAP)
        assert done.all(), kind
        made[kind] = batch
    assert made["bytes"].any()
    for kind, batch in made.items():
        np.testing.assert_array_equal(batch, made["bytes"], err_msg=kind)


def test_a_buffer_that_is_not_contiguous_or_not_a_buffer_is_a_type_error_naming_its_place() -> None:
    from feedfast.loader.backends.cpu import native
    plan_chain = batchplan.chain_of(compile_pil(_spec(SMALL)))
    assert plan_chain is not None
    raw = _jpeg(64, 48)
    strided = np.frombuffer(raw + raw, dtype=np.uint8)[::2]
    for bad, why in [(strided, "not a contiguous buffer"), (memoryview(raw)[::2], "not a contiguous buffer"),
                     ("a str", "must be bytes, a contiguous buffer or None, not str")]:
        with pytest.raises(TypeError, match=rf"plan_batch: raws\[1\] .*{why}"):
            batchplan.plan(plan_chain, [raw, bad], np.arange(2), 0, None)
        if native.ext is not None:
            plans = batchplan.plan(plan_chain, [raw, raw], np.arange(2), 0, None)
            batch = np.zeros((2, 12, 16, 3), dtype=np.uint8)
            with pytest.raises(TypeError, match=rf"sample_batch: raws\[1\] .*{why}"):
                native.ext.sample_batch([raw, bad], plans, np.zeros(2, dtype=np.int8), batch[0], batch, None, None,
                                        False, False, 4, 0, 3.0)
