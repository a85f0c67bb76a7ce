"""DALI is fed each sample's crop window and flips (feedfast.compile.dali_draws, feedfast.loader.backends.dali.draws):
drawn as the threaded and PIL paths draw them, keyed by (seed, epoch, sample), so the backends crop alike and a
state resumed at another batch size delivers the same pixels."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import feedfast
from feedfast.compile.build import build_plan
from feedfast.compile.dali import ReaderConfig, build_pipeline
from feedfast.compile.dali_draws import fed_draws
from feedfast.loader.backends.dali.draws import StepDraws
from feedfast.loader.backends.dali.feed import StepBytes
from feedfast.ops.pil_ops import random_resized_crop_params
from feedfast.order.draws import draws_key, keyed_draws
from feedfast.spec.load import load_spec

GRADIENT_SPEC: dict[str, Any] = {
    "version": 1, "name": "gradients",
    "source": {"components": {"image": {"ext": "jpg;png", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}}},
    "pipeline": {"image": ["decode", {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5}}, "normalize"],
                 "label": ["label"]},
    "outputs": ["image", "label"], "batch": {"size": 8}, "seed": 5,
}


def _gradient(width: int, height: int, fmt: str) -> bytes:
    """An image whose red rises left to right and green top to bottom: a crop's pixels tell where it was cut."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[:, :, 0] = np.arange(width)[None, :] * 255 // (width - 1)
    pixels[:, :, 1] = np.arange(height)[:, None] * 255 // (height - 1)
    pixels[:, :, 2] = 128
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return out.getvalue()


@pytest.fixture(scope="module")
def gradients(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """30 gradient images of several sizes in 2 shards, every fifth a PNG (the C plan reads JPEG headers only)."""
    folder = tmp_path_factory.mktemp("gradients")
    paths = []
    for s in range(2):
        path = folder / f"g-{s}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(15):
                n = s * 15 + i
                fmt = "PNG" if n % 5 == 3 else "JPEG"
                members = ((fmt.lower().replace("jpeg", "jpg"), _gradient(150 + 10 * (n % 7), 110 + 10 * (n % 4), fmt)),
                           ("cls", str(n % 3).encode()))
                for ext, payload in members:
                    info = tarfile.TarInfo(f"{n:04d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        paths.append(str(path))
    return paths


def _images(backend: str, shards: list[str], epochs: int = 2, **kw: Any) -> dict[tuple[int, str], np.ndarray]:
    """Each delivered image by (epoch, sample key)."""
    loader = feedfast.DataLoader(GRADIENT_SPEC, shards=shards, backend=backend, device="cpu", shuffle=True,
                                 num_workers=2, **kw)
    out = {}
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, _ in loader:
            for i, (_, key) in enumerate(loader.last_origins):
                out[(epoch, key)] = images[i].numpy().copy()
    loader.close()
    return out


def test_dali_crops_and_flips_as_the_threaded_and_pil_paths_do(gradients: list[str]) -> None:
    """Over two epochs, JPEGs and PNGs: each image within a fraction of a level of the threaded path's (a crop
    cut elsewhere, or a flip not made, is tens of levels off on these gradients)."""
    dali, threads, pil = (_images(b, gradients) for b in ("dali", "threads", "pil"))
    assert dali.keys() == threads.keys() == pil.keys() and len(dali) == 60
    for where, image in dali.items():
        levels = np.abs(image - threads[where]).mean() * 0.226 * 255  # normalize's std, back to 8-bit levels
        assert levels < 1.5, (where, levels)
        assert np.abs(pil[where] - threads[where]).mean() * 0.226 * 255 < 1.5, where


def test_a_state_resumed_at_another_batch_size_delivers_the_same_pixels(gradients: list[str]) -> None:
    """Elastic: a DALI state taken after 2 batches of 8 resumes with batches of 4; every image is the
    uninterrupted run's, bit for bit (the crops and flips are the sample's, not the pipeline's run)."""
    whole = _images("dali", gradients, epochs=1)
    part = feedfast.DataLoader(GRADIENT_SPEC, shards=gradients, backend="dali", device="cpu", shuffle=True)
    it = iter(part)
    seen = {}
    for _ in range(2):
        images, _ = next(it)
        seen.update({key: images[i].numpy().copy() for i, (_, key) in enumerate(part.last_origins)})
    state = json.loads(json.dumps(part.state_dict()))
    part.close()
    resumed = feedfast.DataLoader(GRADIENT_SPEC, shards=gradients, backend="dali", device="cpu", shuffle=True,
                                  batch_size=4)
    resumed.load_state_dict(state)
    for images, _ in resumed:
        seen.update({key: images[i].numpy().copy() for i, (_, key) in enumerate(resumed.last_origins)})
    resumed.close()
    assert seen.keys() == {key for _, key in whole}
    assert all(np.array_equal(seen[key], whole[(0, key)]) for key in seen)


def test_a_step_s_windows_are_the_threaded_rule_on_the_same_draws(caplog: pytest.LogCaptureFixture) -> None:
    """The C plan (a JPEG), the Python walk (a PNG) and a sample neither reads (named in a warning)."""
    plan = build_plan(load_spec(GRADIENT_SPEC), device="cpu")
    fed = fed_draws(plan)
    assert fed is not None
    members = [_gradient(200, 120, "JPEG"), _gradient(90, 160, "PNG"), b"not an image"]
    data = np.frombuffer(b"".join(members), np.uint8)
    sizes = np.array([len(m) for m in members], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    key, ids = draws_key(5, 1), np.array([7, 8, 9], np.int64)
    with caplog.at_level(logging.WARNING, logger="feedfast.dali"):
        anchor, shape, flips = StepDraws(fed, key).arrays(StepBytes(data, starts, sizes), ids,
                                                           lambda i: ("shard.tar", f"k{i}"))
    draws = keyed_draws(key, ids)
    for i, (width, height) in enumerate([(200, 120), (90, 160)]):
        top, left, h, w = random_resized_crop_params(width, height, (0.08, 1.0), (3 / 4, 4 / 3), draws[i])
        assert anchor[i].tolist() == [left, top] and shape[i].tolist() == [w, h]
        assert flips[i] == int(draws[i].random() < 0.5)
    assert anchor[2].tolist() == [0, 0] and shape[2].tolist() == [1, 1]
    assert "'shard.tar', sample 'k2'" in caplog.text


def _plan(pipeline: list[Any], device: str = "cpu") -> Any:
    spec = {**GRADIENT_SPEC, "pipeline": {"image": pipeline, "label": ["label"]}}
    return build_plan(load_spec(spec), device=device)


def test_which_nodes_take_draws() -> None:
    rrc, flip, norm = {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5}}, "normalize"
    folded = fed_draws(_plan(["decode", rrc, flip, norm]))
    assert folded is not None and folded.window is not None and folded.flip is not None
    assert not folded.flip_vertical and folded.outputs == 3  # crop_mirror_normalize's mirror only
    both = fed_draws(_plan(["decode", rrc, {"flip": {"horizontal": 0.5, "vertical": 0.5}}, norm]))
    assert both is not None and both.flip_vertical and both.outputs == 4
    jitter = fed_draws(_plan(["decode", rrc, {"color_jitter": {"brightness": 0.4}}, flip, norm]))
    assert jitter is not None and jitter.flip is None  # the jitter's draws come between: the flip keeps DALI's
    assert fed_draws(_plan(["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}, norm])) is None
    assert fed_draws(_plan(["decode", {"resize": {"size": 40}}, rrc, flip])) is None  # a crop of a resized view
    first = fed_draws(_plan(["decode", flip, rrc]))
    assert first is not None and first.flip is not None and first.window is None


def test_a_gpu_graph_with_fed_draws_is_a_valid_dali_graph() -> None:
    """Defined and serialized without a GPU (device_id None): ``decoders.image_slice`` on ``mixed`` takes the window."""
    plan = _plan(["decode", {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5}}, "normalize"], "gpu")
    pipe, _ = build_pipeline(plan, ReaderConfig(paths=[], index_paths=[], feed=lambda info: None), batch_size=4,
                             num_threads=1, device_id=None, seed=0)
    assert pipe.serialize()
    names = {type(op).__name__ for op in pipe._ops} | {getattr(op, "name", "") for op in pipe._ops}
    assert any("ImageSlice" in name or "image_slice" in name for name in names), names


def test_torch_tensor_types_unchanged(gradients: list[str]) -> None:
    loader = feedfast.DataLoader(GRADIENT_SPEC, shards=gradients, backend="dali", device="cpu", shuffle=True)
    images, labels = next(iter(loader))
    loader.close()
    assert images.dtype == torch.float32 and tuple(images.shape) == (8, 3, 32, 32) and labels.dtype == torch.int64


