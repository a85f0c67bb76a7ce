"""The header-before-the-data check that remote indexes are held to: no false alarm on any tar layout."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from feedfast.shards.index.tarindex import scan_tar
from feedfast.shards.tar.memberheader import BLOCK, first_problem, header_problem

NAMES = ["a.jpg", "a.cls", "dir/b.jpg", "dir/b.cls", "x" * 120 + ".jpg", "p" * 90 + "/" + "q" * 60 + ".cls",
         "é/ü-c.jpg", "é/ü-c.cls", "k" * 97 + ".json", "d.seg.png"]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_every_member_of_every_tar_format_sits_after_its_own_header(tmp_path: Path, fmt: int) -> None:
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=fmt) as tar:
        for i, name in enumerate(NAMES):
            if fmt == tarfile.USTAR_FORMAT and (len(name) > 100 and "/" not in name or not name.isascii()):
                continue  # ustar cannot hold these
            info = tarfile.TarInfo(name)
            info.size = 3 + i
            tar.addfile(info, io.BytesIO(bytes(info.size)))
    data = path.read_bytes()
    members = [(s.key, m) for s in scan_tar(path) for m in s.members]
    blocks = [data[m.offset - BLOCK: m.offset] for _, m in members]
    assert first_problem(blocks, [k for k, _ in members], [m.size for _, m in members]) is None
    keys = [k for k, _ in members][1:] + [members[0][0]]  # each member named for the next sample
    found = first_problem(blocks, keys, [m.size for _, m in members])
    assert found is not None and "another sample" in found[1]
    key, first = members[0]
    assert "of 3 bytes, not 4" in (header_problem(blocks[0], key=key, size=4) or "")
    assert header_problem(data[first.offset: first.offset + BLOCK], key=key, size=first.size) is not None
    assert header_problem(bytes(BLOCK), key=key, size=first.size) == "there is no member header there"
