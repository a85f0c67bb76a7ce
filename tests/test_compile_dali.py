"""Emitting plans as DALI graphs: the nvJPEG settings of the spec's ``decoder`` section.

GPU graphs are built and serialized with ``device_id=None``, which works without a GPU (see
DALI-NOTES); the serialized protobuf holds each argument's name and its value (a float as
four little-endian bytes, an integer as a varint).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from feedfast.compile.build import build_plan
from feedfast.compile.dali import ReaderConfig, build_pipeline
from feedfast.spec import load_spec
from feedfast.spec.model import DECODER_PARAMS
from tests.helpers import SMALL_SPEC

ROOT = Path(__file__).resolve().parents[1]
DECODER_KEYS = [p.name.encode() for p in DECODER_PARAMS]
TUNED = ["decoder.hw_decoder_load=0.3", "decoder.device_memory_padding=123456789"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _serialized(spec: object, device: str) -> bytes:
    plan = build_plan(spec, device=device)  # type: ignore[arg-type]
    reader = ReaderConfig(paths=["x.tar"], index_paths=["x.idx"])
    pipe, _ = build_pipeline(plan, reader, batch_size=2, num_threads=1, device_id=None, seed=1)
    return pipe.serialize()


@pytest.mark.parametrize("overrides", [[], ["pipeline.image[1]=center_crop"]], ids=["fused-roi-decode", "decode"])
def test_gpu_graph_carries_the_decoder_settings(overrides: list[str]) -> None:
    spec = load_spec(SMALL_SPEC, [*overrides, "pipeline.image[1].size=32"] if overrides else TUNED)
    text = _serialized(spec, "gpu")
    assert b"mixed" in text
    for key in DECODER_KEYS:
        assert key in text, key
    if not overrides:  # the spec's values, not DALI's defaults
        assert struct.pack("<f", 0.3) in text and _varint(123456789) in text


def test_cpu_graph_has_no_decoder_settings() -> None:
    text = _serialized(load_spec(SMALL_SPEC, TUNED), "cpu")
    assert b"mixed" not in text
    for key in DECODER_KEYS:
        assert key not in text, key


def test_plan_shows_the_settings_on_the_mixed_decode_only() -> None:
    spec = load_spec(ROOT / "pipelines/imagenet-val.yaml", ["decoder.hw_decoder_load=0.75"])
    gpu = build_plan(spec, device="gpu").to_dict()["nodes"]
    decoders = [n for n in gpu if "decoder" in n]
    assert [n["device"] for n in decoders] == ["mixed"] and decoders[0]["op"] == "decoders.image"
    assert decoders[0]["decoder"]["hw_decoder_load"] == 0.75
    assert decoders[0]["decoder"]["preallocate_width_hint"] == 5980
    assert not any("decoder" in n for n in build_plan(spec, device="cpu").to_dict()["nodes"])
