"""The tar scanner reads what tarfile reads: members of many tars, hand-made headers, and damage."""

from __future__ import annotations

import io
import os
import random
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from feedfast.errors import ShardError
from feedfast.shards.tar import scan as tarscan
from feedfast.shards.tar.fields import first_bad_header, number
from feedfast.shards.tar.scan import scan_members

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
NAMES = ["plain.jpg", "a b/with space.cls", "ünïcødé/naïve-名前.jpg", "deep/" + "d" * 120 + "/long-" + "x" * 130 + ".jpg",
         "p" * 99 + ".txt", "q" * 100 + ".txt", "pre/" * 30 + "fix.seg.png", "100%.cls", "new\nline.txt"]


def tarfile_members(path: Path) -> list[tuple[str, int, int]]:
    """What the scanner must give: tarfile's regular files."""
    with tarfile.open(path, "r:") as tar:
        return [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]


def add(tar: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, **fields: object) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mtime = 1_700_000_000
    for field, value in fields.items():
        setattr(info, field, value)
    tar.addfile(info, io.BytesIO(data) if info.size else None)


def everything(tar: tarfile.TarFile, fmt: str, rng: random.Random) -> None:
    """Files (long, non-ASCII, empty, multi-block), directories, links, a FIFO, in random order."""
    items: list[tuple[str, bytes, bytes, dict[str, object]]] = []
    for i, name in enumerate(NAMES):
        if fmt == "ustar" and len(name.encode()) > 100 and ("/" not in name or len(name.rsplit("/", 1)[1]) > 100):
            continue  # ustar cannot hold it
        if fmt == "ustar" and len(name.encode()) > 255:
            continue
        items.append((name, os.urandom(rng.choice([0, 1, 511, 512, 513, 5000])), tarfile.REGTYPE, {}))
        items.append((f"dir{i}/", b"", tarfile.DIRTYPE, {}))
    items.append(("link", b"", tarfile.SYMTYPE, {"linkname": "plain.jpg"}))
    items.append(("hard", b"", tarfile.LNKTYPE, {"linkname": "plain.jpg"}))
    items.append(("fifo", b"", tarfile.FIFOTYPE, {}))
    if fmt != "ustar":
        items.append(("longlink", b"", tarfile.SYMTYPE, {"linkname": "t" * 150}))
    rng.shuffle(items)
    for name, data, kind, fields in items:
        add(tar, name, data, kind, **fields)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("seed", range(4))
def test_same_members_as_tarfile(tmp_path: Path, fmt: str, seed: int) -> None:
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w", format=FORMATS[fmt], encoding="utf-8") as tar:
        everything(tar, fmt, random.Random(seed))
    expected = tarfile_members(shard)
    assert len(expected) >= 5
    assert scan_members(str(shard)) == expected


def test_pax_global_header_and_binary_names(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tar:
        add(tar, "caf\udce9.jpg", b"x" * 10)  # not UTF-8: written with hdrcharset=BINARY
        add(tar, "ok.jpg", b"y")
    assert b"hdrcharset=BINARY" in shard.read_bytes()
    assert scan_members(str(shard)) == tarfile_members(shard)


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs a tar program")
@pytest.mark.parametrize("fmt", ["gnu", "oldgnu", "pax", "ustar", "v7"])
def test_same_members_as_tarfile_for_gnu_tar(tmp_path: Path, fmt: str) -> None:
    tree = tmp_path / "tree"
    names = ["plain.jpg", "ünïcødé-名前.jpg", "empty.cls"]
    if fmt in ("gnu", "oldgnu", "pax"):
        names.append("d" * 120 + "/long-" + "x" * 130 + ".jpg")
    for i, name in enumerate(names):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(b"z" * (0 if name.startswith("empty") else 700 * i + 3))
    (tree / "sub").mkdir()
    (tree / "sub" / "link").symlink_to("../plain.jpg")
    os.link(tree / "plain.jpg", tree / "hard.jpg")
    shard = tmp_path / "s.tar"
    subprocess.run(["tar", f"--format={fmt}", "-cf", str(shard), "-C", str(tree), "."], check=True)
    expected = tarfile_members(shard)
    assert len(expected) >= 3
    assert scan_members(str(shard)) == expected


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs a tar program")
@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_sparse_members_are_refused(tmp_path: Path, fmt: str) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    with open(tree / "sparse.bin", "wb") as f:
        f.write(b"head")
        f.seek(1 << 20)
        f.write(b"tail")
    (tree / "after.cls").write_bytes(b"7")
    shard = tmp_path / "s.tar"
    subprocess.run(["tar", f"--format={fmt}", "--sparse", "-cf", str(shard), "-C", str(tree), "."], check=True)
    with pytest.raises(ShardError, match=r"s\.tar.*sparse member at offset \d+.*without --sparse"):
        scan_members(str(shard))


def header(name: bytes, size_field: bytes, kind: bytes = b"0", *, mode: bytes = b"0000644\0",
           signed: bool = False, checksum_form: str = "%06o\0 ") -> bytes:
    """One hand-made 512-byte header; its checksum written in ``checksum_form`` (signed sum if ``signed``)."""
    block = bytearray(512)
    block[0:len(name)] = name
    block[100:108] = mode
    block[108:124] = b"0001750\0" * 2
    block[124:136] = size_field
    block[136:148] = b"14540000000\0"
    block[156:157] = kind
    block[257:265] = b"ustar\x0000"
    block[148:156] = b" " * 8
    total = sum((b - 256 if signed and b > 127 else b) for b in block)
    block[148:156] = (checksum_form % total).encode()[:8].ljust(8, b"\0")
    return bytes(block)


def test_number_fields() -> None:
    assert number(b"0000644\0") == 0o644
    assert number(b"   644 \0") == 0o644
    assert number(b"\0" * 8) == 0 == number(b" " * 8)
    assert number(b"\x80" + (10 * 2**33).to_bytes(11, "big")) == 10 * 2**33  # an 80 GiB size, GNU's base-256
    assert number(b"\xff" * 12) == -1
    with pytest.raises(ValueError):
        number(b"12 34\0\0\0")
    with pytest.raises(ValueError):
        number(b"0000648\0")


def test_base_256_size_and_odd_number_forms(tmp_path: Path) -> None:
    data = b"q" * 700
    blocks = [
        header(b"big.bin", b"\x80" + len(data).to_bytes(11, "big")) + data.ljust(1024, b"\0"),
        header("ünï.bin".encode(), b"%011o\0" % 3, signed=True) + b"abc".ljust(512, b"\0"),
        header(b"spaces.bin", b"3".rjust(7).ljust(12), mode=b"  644 \0\0", checksum_form="%7o\0") + b"def".ljust(512, b"\0"),
        header(b"olddir/", b"0" * 11 + b"\0", kind=b"\0"),  # v7: a regular-file type named like a folder
        header(b"v7.bin", b"%011o\0" % 1, kind=b"\0") + b"g".ljust(512, b"\0"),
    ]
    shard = tmp_path / "s.tar"
    shard.write_bytes(b"".join(blocks) + bytes(1024))
    expected = tarfile_members(shard)
    assert [n for n, _, _ in expected] == ["big.bin", "ünï.bin", "spaces.bin", "v7.bin"]
    assert scan_members(str(shard)) == expected
    assert expected[0][2] == 700


def test_first_bad_header() -> None:
    good = header(b"a", b"%011o\0" % 0)
    assert first_bad_header([good, good]) is None
    assert first_bad_header([good, good[:100] + b"\xff" + good[101:]]) == 1  # the checksum no longer matches
    bad_mode = header(b"a", b"%011o\0" % 0, mode=b"0006x4\0\0")  # a right checksum over a field that is no number
    assert first_bad_header([good, good, bad_mode]) == 2


def reference(path: Path) -> list[tuple[str, int, int]]:
    """tarfile's reading with feedfast's damage rules: a member's data within the file, an end-of-archive block."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            tar = tarfile.open(fileobj=f, mode="r:")
            found = [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
        except (tarfile.ReadError, EOFError, UnicodeDecodeError) as exc:
            raise ShardError(str(exc)) from exc
        if any(off + n > size or n < 0 for _, off, n in found):
            raise ShardError("truncated")
        if any(m.issparse() for m in tar.getmembers()):
            raise ShardError("sparse")
        f.seek(tar.offset)
        tail = f.read(512)
        if len(tail) < 512 or tail.strip(b"\0"):
            raise ShardError("no end-of-archive")
    return found


def outcome(fn: object, path: Path) -> object:
    try:
        return fn(path)  # type: ignore[operator]
    except ShardError:
        return "error"


def ours(path: Path) -> list[tuple[str, int, int]]:
    return scan_members(str(path))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_cut_is_found(tmp_path: Path, fmt: str) -> None:
    good = tmp_path / "good.tar"
    with tarfile.open(good, "w", format=FORMATS[fmt]) as tar:
        everything(tar, fmt, random.Random(7))
    raw = good.read_bytes()
    members = tarfile_members(good)
    with tarfile.open(good) as tar:
        tar.getmembers()
        complete = tar.offset + 512  # the end of the first end-of-archive block
    cuts = sorted({0, 1, 511, 512, complete - 1, complete, len(raw) - 1} | set(range(0, complete + 1024, 97))
                  | {off for _, off, _ in members} | {off - 512 for _, off, _ in members})
    cut = tmp_path / "cut.tar"
    for at in cuts:
        cut.write_bytes(raw[:at])
        assert outcome(ours, cut) == outcome(reference, cut), at
        if at < complete:
            with pytest.raises(ShardError, match="cut.tar"):
                scan_members(str(cut))
        else:
            assert scan_members(str(cut)) == members


def test_a_cut_in_the_first_member_is_truncation(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tar:
        add(tar, "a.jpg", b"x" * 2000)
    shard.write_bytes(shard.read_bytes()[:700])
    with pytest.raises(ShardError, match=r"shard is truncated: .*s\.tar.*'a\.jpg' needs bytes up to 2512 but the file has 700"):
        scan_members(str(shard))


def test_cut_at_a_member_boundary_is_an_error(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        add(tar, "a.jpg", b"x" * 600)
        add(tar, "b.jpg", b"y" * 512)
    raw = shard.read_bytes()
    boundary = 512 + 1024 + 512 + 512
    (tmp_path / "cut.tar").write_bytes(raw[:boundary])
    assert tarfile_members(tmp_path / "cut.tar") == tarfile_members(shard)  # tarfile sees nothing wrong
    with pytest.raises(ShardError, match=r"cut\.tar.*offset 2560.*no end-of-archive"):
        scan_members(str(tmp_path / "cut.tar"))


@pytest.mark.parametrize("batch", [3, tarscan.VERIFY_BATCH], ids=["small-batches", "default"])
@pytest.mark.parametrize("seed", range(6))
def test_flipped_bytes_as_tarfile_sees_them(tmp_path: Path, seed: int, batch: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tarscan, "VERIFY_BATCH", batch)  # headers verified a few at a time, or all at once
    rng = random.Random(seed)
    good = tmp_path / "good.tar"
    fmt = sorted(FORMATS)[seed % 3]
    with tarfile.open(good, "w", format=FORMATS[fmt]) as tar:
        everything(tar, fmt, rng)
    raw = good.read_bytes()
    bad = tmp_path / "bad.tar"
    for _ in range(60):
        damaged = bytearray(raw)
        for _ in range(rng.choice([1, 1, 2, 8])):
            damaged[rng.randrange(len(raw))] = rng.randrange(256)
        bad.write_bytes(bytes(damaged))
        expected = outcome(reference, bad)
        assert outcome(ours, bad) == expected


def test_not_a_tar_and_empty(tmp_path: Path) -> None:
    noise = tmp_path / "noise.tar"
    noise.write_bytes(bytes((i * 197 + 13) % 251 for i in range(4096)))
    with pytest.raises(ShardError, match="not a readable tar file"):
        scan_members(str(noise))
    (tmp_path / "empty.tar").write_bytes(b"")
    with pytest.raises(ShardError, match="not a readable tar file.*empty"):
        scan_members(str(tmp_path / "empty.tar"))
    (tmp_path / "zeros.tar").write_bytes(bytes(10240))
    assert scan_members(str(tmp_path / "zeros.tar")) == []
    with pytest.raises(ShardError, match="not found"):
        scan_members(str(tmp_path / "nope.tar"))
    with pytest.raises(ShardError, match="directory"):
        scan_members(str(tmp_path))


def test_salvage_gives_the_members_before_the_damage_and_the_damage(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("a.jpg", "a.cls", "b.jpg", "b.cls"):
            add(tar, name, b"x" * 600)
    raw = shard.read_bytes()
    whole = tarfile_members(shard)
    assert tarscan.salvage_members(str(shard)) == (whole, None)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(raw[: whole[2][1] + 100])  # inside b.jpg's data
    found, damage = tarscan.salvage_members(str(cut))
    assert found == whole[:2] and damage is not None and damage.member == "b.jpg"
    assert damage.offset == whole[2][1] - 512 and f"at offset {damage.offset}" in damage.message
    with pytest.raises(ShardError, match=damage.message.replace("(", r"\(").replace(")", r"\)")):
        scan_members(str(cut))
    garbage = bytearray(raw)
    garbage[whole[1][1] - 512] ^= 0xFF  # a.cls's header: its checksum no longer holds
    cut.write_bytes(bytes(garbage))
    found, damage = tarscan.salvage_members(str(cut))
    assert found == whole[:1] and damage is not None and damage.member is None
    assert damage.offset == whole[1][1] - 512 and "not a valid tar header" in damage.message


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz"])
def test_a_compressed_tar_is_refused_by_name_with_the_command_that_unpacks_it(tmp_path: Path, kind: str) -> None:
    import bz2
    import gzip
    import lzma

    plain = tmp_path / "p.tar"
    with tarfile.open(plain, "w") as tar:
        add(tar, "a.jpg", b"x" * 600)
    pack = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress}[kind]
    command = {"gzip": "gunzip -k", "bzip2": "bunzip2 -k", "xz": "unxz -k"}[kind]
    shard = tmp_path / "s.tar.x"
    shard.write_bytes(pack(plain.read_bytes()))
    for scan in (scan_members, tarscan.salvage_members):
        with pytest.raises(ShardError, match=rf"s\.tar\.x.*is {kind}-compressed.*{command}"):
            scan(str(shard))
    assert tarscan.compression_of(b"\x28\xb5\x2f\xfd rest") == ("zstd", "unzstd {path}")
