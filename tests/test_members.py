"""sources/members.py: a chunk's member bytes read in one call."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from feedfast.sources.members import read_members


def test_read_gives_each_sample_s_bytes_and_none_where_short(tmp_path: Any) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = read_members(np.array([fd, fd, fd, fd]), np.array([0, 10, 1020, -1]), np.array([4, 3, 10, 1]))
    finally:
        os.close(fd)
    assert got == [bytes([0, 1, 2, 3]), bytes([10, 11, 12]), None, None]
