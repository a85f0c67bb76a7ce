"""Fuzzing tars and JPEGs: every sample is delivered, skipped and reported, or a clear error is raised."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import feedfast
from feedfast.errors import FeedfastError
from feedfast.shards.index.tarindex import scan_tar
from tests.corpus import corpus_members, write_tar
from tests.helpers import SMALL_SPEC
from tests.jpegcases import decodes_with_pil, fuzz_members

pytestmark = pytest.mark.slow


def _clean_tar(tmp: Path) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in corpus_members():
            if name.split(".")[0] in ("ok1", "cmyk", "png", "ok2", "ok3", "gray"):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _spec() -> dict:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["source"] = {"components": {"image": {"ext": "jpg", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}},
                      "missing": "skip", "on_error": "skip"}
    return spec


mutation = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.0, 1.0)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 255)), min_size=1, max_size=8)),
    st.tuples(st.just("zero"), st.floats(0.0, 1.0), st.integers(1, 2000)),
)


def _mutate(data: bytes, m: tuple) -> bytes:  # type: ignore[type-arg]
    b = bytearray(data)
    if m[0] == "truncate":
        return bytes(b[: int(len(b) * m[1])])
    if m[0] == "flip":
        for where, x in m[1]:
            i = min(int(where * len(b)), len(b) - 1)
            b[i] ^= x
        return bytes(b)
    start = int(m[1] * len(b))
    b[start:start + m[2]] = bytes(len(b[start:start + m[2]]))
    return bytes(b)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=mutation)
def test_mutated_shards_never_lose_samples_silently(tmp_path: Path, m: tuple) -> None:  # type: ignore[type-arg]
    clean = _clean_tar(tmp_path)
    import uuid

    path = tmp_path / f"f-{uuid.uuid4().hex}.tar"
    path.write_bytes(_mutate(clean, m))
    try:
        samples = scan_tar(path)
        loader = feedfast.DataLoader(_spec(), shards=str(path), batch_size=2, num_workers=1)
        delivered = []
        for _ in loader:
            delivered += [k for _, k in loader.last_origins[: loader.last_valid]]
    except FeedfastError as exc:
        assert str(exc) and ("shard" in str(exc) or "sample" in str(exc)), str(exc)
        return
    stats = loader.stats()
    assert len(delivered) == len(set(delivered)) == stats["delivered"]
    assert stats["delivered"] + stats["skipped"] == len(samples)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=mutation)
def test_mutated_shards_under_raise_deliver_everything_or_name_shard_and_sample(tmp_path: Path, m: tuple) -> None:  # type: ignore[type-arg]
    import uuid

    path = tmp_path / f"r-{uuid.uuid4().hex}.tar"
    path.write_bytes(_mutate(_clean_tar(tmp_path), m))
    spec = _spec()
    spec["source"]["on_error"] = "raise"
    try:
        samples = scan_tar(path)
        loader = feedfast.DataLoader(spec, shards=str(path), batch_size=2, num_workers=1)
        delivered = []
        for _ in loader:
            delivered += [k for _, k in loader.last_origins[: loader.last_valid]]
    except FeedfastError as exc:  # any other class escaping is the failure this test looks for
        assert str(exc) and ("shard" in str(exc) or "sample" in str(exc)), str(exc)
        return
    assert sorted(delivered) == sorted(s.key for s in samples if any(m.ext == "jpg" for m in s.members)
                                       and any(m.ext == "cls" for m in s.members))


# --- one rule for what is delivered, whatever the backend (issue 24, item 4) ----------------------

def _fuzz_spec(policy: str) -> dict:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["pipeline"] = {"image": ["decode", {"center_crop": {"size": [48, 64]}}], "label": ["label"]}  # exact pixels
    spec["source"] = {"components": {"image": {"ext": "jpg", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}},
                      "on_error": policy}
    return spec


def _deliver(spec: dict, shard: str, backend: str) -> dict[str, np.ndarray]:
    """{key: HWC pixels} of everything the backend delivers in one epoch."""
    loader = feedfast.DataLoader(spec, shards=shard, batch_size=2, num_workers=1, backend=backend, placement="cpu")
    out = {}
    for images, _ in loader:
        for (_, key), img in zip(loader.last_origins[: loader.last_valid], images):
            out[key] = np.asarray(img)
    return out


def test_the_fuzz_set_is_what_it_claims() -> None:
    from feedfast.checks.decoders import DaliDecoder

    dali = DaliDecoder()
    for name, data in fuzz_members(broken=True)[::2]:
        key = name.split(".")[0]
        pil_ok, dali_ok = decodes_with_pil(data), dali.decode(data, color="any")[0] is not None
        expected = {"good": (True, True), "dali": (False, True), "lossless": (False, True), "pil": (True, False),
                    "cut": (False, False)}[key.split("-")[0]]
        assert (pil_ok, dali_ok) == expected, key


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_pil_and_dali_backends_deliver_the_same_fuzzed_images(tmp_path: Path, policy: str) -> None:
    lossless = policy == "skip"  # under raise, see test_dali_backend_rescues_a_jpeg_dali_reads_only_as_grey
    shard = str(write_tar(tmp_path / "fuzz-0000.tar", fuzz_members(broken=policy == "skip", lossless=lossless)))
    spec = _fuzz_spec(policy)
    dali, pil = _deliver(spec, shard, "dali"), _deliver(spec, shard, "pil")
    keys = [name.split(".")[0] for name, _ in fuzz_members(broken=False, lossless=lossless)[::2]]
    assert sorted(dali) == sorted(pil) == sorted(keys)  # everything one decoder reads; under skip, not cut-*
    for key in keys:
        assert dali[key].shape == pil[key].shape == (48, 64, 3), key
        assert np.abs(dali[key].astype(int) - pil[key].astype(int)).max() <= 1, key


def test_dali_backend_rescues_a_jpeg_dali_reads_only_as_grey(tmp_path: Path) -> None:
    members = [m for m in fuzz_members(broken=False) if m[0].split(".")[0] in ("good-0", "lossless", "good-1")]
    shard = str(write_tar(tmp_path / "fuzz-0000.tar", members))
    dali, pil = _deliver(_fuzz_spec("raise"), shard, "dali"), _deliver(_fuzz_spec("raise"), shard, "pil")
    assert sorted(dali) == sorted(pil) == ["good-0", "good-1", "lossless"]
    assert np.array_equal(dali["lossless"], pil["lossless"])


def test_threaded_path_delivers_what_dali_decodes_under_raise(tmp_path: Path) -> None:
    shard = str(write_tar(tmp_path / "fuzz-0000.tar", fuzz_members(broken=False)))
    spec = _fuzz_spec("raise")
    pil, threads = _deliver(spec, shard, "pil"), _deliver(spec, shard, "threads")  # pil: as the DALI backend, above
    assert sorted(threads) == sorted(pil) == sorted(name.split(".")[0] for name, _ in fuzz_members(broken=False)[::2])
    for key, pixels in pil.items():
        assert np.abs(pixels.astype(int) - threads[key].astype(int)).max() <= 1, key


def _codec_members() -> tuple[list[tuple[str, bytes]], dict[str, np.ndarray]]:
    """An LZMA TIFF, a JPEG 2000 and a lossless WebP of one picture (members named .jpg: the bytes decide)."""
    import io

    from tests.corpus import photo

    img = photo(4, 64, 48)
    members, pixels = [], {}
    for n, (key, fmt, kw) in enumerate([("tiff", "TIFF", {"compression": "tiff_lzma"}), ("jp2", "JPEG2000", {}),
                                        ("webp", "WEBP", {"lossless": True})]):
        out = io.BytesIO()
        img.save(out, fmt, **kw)
        members += [(f"{key}.jpg", out.getvalue()), (f"{key}.cls", str(n).encode())]
        pixels[key] = np.asarray(img)
    return members, pixels


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_tiff_jpeg2000_and_webp_are_delivered_by_both_backends(tmp_path: Path, policy: str) -> None:
    members, pixels = _codec_members()
    shard = str(write_tar(tmp_path / "codecs-0000.tar", members))
    for backend in ("pil", "dali"):
        got = _deliver(_fuzz_spec(policy), shard, backend)
        assert sorted(got) == sorted(pixels), backend  # pillow-simd built with libtiff, OpenJPEG, libwebp
        for key, expected in pixels.items():
            assert np.array_equal(got[key], expected), (backend, key)
