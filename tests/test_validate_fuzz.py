"""Fuzzing tars and JPEGs: every sample is delivered, skipped and reported, or a clear error is raised."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import feedfast
from feedfast.errors import FeedfastError
from feedfast.sources.index import scan_tar
from tests.corpus import corpus_members
from tests.helpers import SMALL_SPEC

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
