"""Generic host ops on hostile bytes: a DecodeFailure (which the loader names), never another exception."""

from __future__ import annotations

import random

import pytest

from feedfast.ops.generic import DecodeFailure, _json_host, _label_host, _npy_host

HOSTILE = [b"", b"\x00" * 10, b"[" * 100_000, b'{"a": ' * 50_000, b"\xff\xfe\xfd", b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', "
           b"'fortran_order': False, 'shape': (99999999999, 99999999999), }" + b" " * 40 + b"\n",
           b"\x93NUMPY\x01\x00\x10\x00{'descr': 'O'}   \n", b"12x", b"-", b"1e5"]


@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_bytes_raise_decode_failure_only(raw: bytes) -> None:
    rng = random.Random(0)
    for host, params in ((_json_host, {"field": ""}), (_npy_host, {"dtype": "float32"}), (_label_host, {"offset": 0})):
        try:
            host(raw, params, rng)
        except DecodeFailure:
            pass
