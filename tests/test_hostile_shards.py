"""Hostile shards and indexes (issue 24): damage is an error naming shard and offset, or a counted skip; never silent.

Every row of the issue's table that concerns local tars and their indexes, under both policies and
on the DALI and threaded backends: indexes that lie (short, swapped offsets, negative offsets, a
shard rewritten in place with the same size and mtime), names an index must escape, tars cut or
corrupted, compressed tars, and adjacent copies of a key.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import pytest

import feedfast
from feedfast.cli.main import main
from feedfast.errors import ShardError
from feedfast.shards.index.notes import UNKNOWN_KEY
from feedfast.shards.index.tarindex import (
    default_index_path,
    format_index,
    load_index,
    parse_index,
    read_index,
    scan_tar,
)

BACKENDS = ["dali", "threads"]
KEYS = [f"k{i}" for i in range(10)]


def _spec(on_error: str) -> dict:
    return {"pipeline": {"label": ["label"]},
            "source": {"components": {"label": {"ext": "cls", "kind": "label"}}, "on_error": on_error}}


def _members(keys: list[str], labels: list[int] | None = None, payload: int = 100) -> list[tuple[str, bytes]]:
    """``key.txt`` (``payload`` bytes) then ``key.cls`` for each key; the label defaults to the key's number."""
    out = []
    for i, key in enumerate(keys):
        label = labels[i] if labels is not None else int(key.lstrip("k")) if key.lstrip("k").isdigit() else i
        text = f"{key}:".encode("utf-8", "surrogateescape").ljust(payload, b".")
        out += [(f"{key}.txt", text), (f"{key}.cls", str(label).encode())]
    return out


def _tar(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt, encoding="utf-8", errors="surrogateescape") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def _epoch(shards: str | list[str], on_error: str = "raise", backend: str = "dali",
           cache: Path | None = None) -> tuple[list[tuple[str, int]], feedfast.DataLoader]:
    """(key, label) of one unshuffled epoch, and the loader."""
    kw = {"cache_dir": str(cache)} if cache is not None else {}
    loader = feedfast.DataLoader(_spec(on_error), shards=shards, batch_size=3, shuffle=False, num_workers=1,
                                 backend=backend, rank=0, world_size=1, **kw)
    got = []
    for (labels,) in loader:
        got += [(k, int(y)) for (_, k), y in zip(loader.last_origins[: loader.last_valid],
                                                 labels[: loader.last_valid].tolist())]
    return got, loader


def _rows(index: Path) -> list[list[str]]:
    return [line.split(" ") for line in index.read_text().split("\n")[1:] if line]


def _write_rows(index: Path, header: str, rows: list[list[str]]) -> None:
    index.write_text("\n".join([header] + [" ".join(r) for r in rows]) + "\n")


EXPECTED = [(k, int(k[1:])) for k in KEYS]


# --- item 2: indexes are checked, not trusted ----------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_whose_header_declares_more_samples_than_it_lists_is_rebuilt(tmp_path: Path, backend: str) -> None:
    """Was: 5 of 10 delivered, stats clean."""
    shard = _tar(tmp_path / "s.tar", _members(KEYS))
    load_index(shard, tmp_path / "cache")
    index = default_index_path(shard)
    _write_rows(index, "v1.2 10", _rows(index)[:5])
    with pytest.warns(UserWarning, match=r"s\.idx.*does not describe.*declares 10 samples.*lists 5"):
        got, loader = _epoch(shard, backend=backend, cache=tmp_path / "cache")
    assert got == EXPECTED and loader.stats()["skipped"] == 0
    assert len(read_index(index, shard)) == 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_swapped_label_offsets_in_a_local_index_are_caught(tmp_path: Path, backend: str) -> None:
    """Was: samples 0 and 1 delivered with each other's labels, silently."""
    shard = _tar(tmp_path / "s.tar", _members(KEYS))
    load_index(shard, tmp_path / "cache")
    index = default_index_path(shard)
    rows = _rows(index)
    rows[0][5:7], rows[1][5:7] = rows[1][5:7], rows[0][5:7]  # k0.cls and k1.cls point at each other's data
    _write_rows(index, "v1.2 10", rows)
    with pytest.warns(UserWarning, match=r"member 'k0\.cls' at offset \d+: the header before it is that of 'k1\.cls'"):
        got, _ = _epoch(shard, backend=backend, cache=tmp_path / "cache")
    assert got == EXPECTED


@pytest.mark.parametrize("offset", ["-512", "99999999", "700"], ids=["negative", "past-the-end", "off-block"])
def test_an_offset_outside_the_shard_is_a_shard_error_or_a_rebuild_never_an_oserror(tmp_path: Path,
                                                                                      offset: str) -> None:
    """Was: raw ``OSError: [Errno 22]`` (negative), no shard named."""
    shard = _tar(tmp_path / "s.tar", _members(KEYS))
    load_index(shard, tmp_path / "cache")
    index = default_index_path(shard)
    rows = _rows(index)
    rows[0][5] = offset
    _write_rows(index, "v1.2 10", rows)
    with pytest.raises(ShardError, match=rf"s\.tar.*'k0\.cls' at offset {offset}"):
        read_index(index, shard)  # an index given as is (a filtered one, a baseline's): refused, naming the shard
    with pytest.warns(UserWarning, match=r"does not describe shard"):
        got, _ = _epoch(shard, cache=tmp_path / "cache")  # one the loader found: rebuilt from the tar
    assert got == EXPECTED


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shard_rewritten_in_place_with_the_same_size_and_mtime_is_opened_afresh(tmp_path: Path,
                                                                                  backend: str) -> None:
    """Was: the recorded open (and the index beside the shard) used: every key paired with another's label."""
    path = tmp_path / "s.tar"
    shard = _tar(path, _members(KEYS))
    assert _epoch(shard, backend=backend, cache=tmp_path / "cache")[0] == EXPECTED
    st = path.stat()
    _tar(path, _members(KEYS[::-1]))  # the same members in the other order: same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    with pytest.warns(UserWarning, match="content fingerprint differs"):
        got, _ = _epoch(shard, backend=backend, cache=tmp_path / "cache")
    assert got == EXPECTED[::-1]


def test_a_wds2idx_index_is_checked_and_used_as_is(tmp_path: Path) -> None:
    """DALI's own index writer's output (data offsets, no notes) passes the checks: no rebuild, no warning."""
    shard = _tar(tmp_path / "s.tar", _members(KEYS), fmt=tarfile.USTAR_FORMAT)
    index = default_index_path(shard)
    subprocess.run([sys.executable, "-m", "wds2idx", shard, str(index)], check=True, capture_output=True)
    before = index.read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert _epoch(shard, cache=tmp_path / "cache")[0] == EXPECTED
    assert index.read_text() == before


AWKWARD = ["car\rriage", "line\u2028sep", "para\u2029sep", "nel\x85x", "tab\tx", "vt\x0bff\x0cx", "fs\x1cgs\x1dx",
           "100%", "%20lit", "a b", "nbsp\u00a0x", "名前", "emoji\U0001f600", "bytes\udcff\udc80"]


def test_awkward_names_round_trip_through_the_index(tmp_path: Path) -> None:
    """Was: 'invalid literal for int()' (\\r), or another sample count (U+2028: str.splitlines splits there)."""
    shard = _tar(tmp_path / "s.tar", _members(AWKWARD, labels=list(range(len(AWKWARD)))))
    samples = scan_tar(shard)
    assert [s.key for s in samples] == AWKWARD
    text = format_index(samples)
    assert len(text.split("\n")) == len(AWKWARD) + 2 and all(len(r.split(" ")) == 8 for r in text.split("\n")[1:-1])
    assert parse_index(text) == samples
    where, again = load_index(shard, tmp_path / "cache")
    assert again == samples and load_index(shard, tmp_path / "cache") == (where, samples)  # reused, not rebuilt


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loader_delivers_awkward_names_with_their_own_labels(tmp_path: Path, backend: str) -> None:
    shard = _tar(tmp_path / "s.tar", _members(AWKWARD, labels=list(range(len(AWKWARD)))))
    got, _ = _epoch(shard, backend=backend, cache=tmp_path / "cache")
    assert got == [(k, i) for i, k in enumerate(AWKWARD)]


# --- item 1: a damaged shard costs only its damaged samples ---------------------------------------------------------

def _cuts(good: Path) -> dict[str, int]:
    """Where to cut a copy of ``good`` (10 samples of .txt then .cls), by kind of damage."""
    samples = scan_tar(good)
    k6 = samples[6]
    return {
        "member boundary": k6.members[-1].offset + 512,       # after k6.cls's data block: no end-of-archive
        "between a sample's members": k6.members[0].offset + 512,  # after k6.txt: k6.cls is cut off
        "inside member data": k6.members[0].offset + 50,           # inside k6.txt's 100 bytes
        "inside padding": k6.members[0].offset + 300,              # after k6.txt's data, inside its block
        "inside a header": k6.members[-1].offset - 512 + 100,      # inside k6.cls's header
    }


CUTS = ["member boundary", "between a sample's members", "inside member data", "inside padding", "inside a header"]
KEPT = {"member boundary": 7, "between a sample's members": 6, "inside member data": 6, "inside padding": 6,
        "inside a header": 6}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cut", CUTS)
def test_under_skip_a_cut_shard_costs_only_its_damaged_samples(tmp_path: Path, cut: str, backend: str) -> None:
    """Was: ShardError in the constructor, every valid sample of every shard lost."""
    good = _tar(tmp_path / "good.tar", _members(KEYS))
    raw = Path(good).read_bytes()
    bad = tmp_path / "bad.tar"
    bad.write_bytes(raw[: _cuts(Path(good))[cut]])
    with pytest.warns(UserWarning, match=r"bad\.tar.*(offset|byte) \d+.*reading its \d+ complete sample"):
        got, loader = _epoch([good, str(bad)], on_error="skip", backend=backend, cache=tmp_path / "cache")
    kept = KEPT[cut]
    assert got == EXPECTED + EXPECTED[:kept]
    skipped = loader.skipped_samples()
    assert all(s["shard"] == str(bad) and "offset" in s["reason"] for s in skipped)
    assert [s["key"] for s in skipped] == ([] if kept == 7 else ["k6"]) + [UNKNOWN_KEY]
    assert loader.stats()["skipped"] == len(skipped)
    again, loader = _epoch([good, str(bad)], on_error="skip", backend=backend, cache=tmp_path / "cache")
    assert again == got and loader.skipped_samples() == skipped  # the recorded open says the same


@pytest.mark.parametrize("cut", CUTS)
def test_under_raise_a_cut_shard_is_one_error_naming_shard_and_offset(tmp_path: Path, cut: str) -> None:
    good = _tar(tmp_path / "good.tar", _members(KEYS))
    bad = tmp_path / "bad.tar"
    bad.write_bytes(Path(good).read_bytes()[: _cuts(Path(good))[cut]])
    with pytest.raises(ShardError, match=r"bad\.tar.*at offset \d+"):
        _epoch([good, str(bad)], cache=tmp_path / "cache")
    with pytest.warns(UserWarning):
        _epoch([good, str(bad)], on_error="skip", cache=tmp_path / "cache")  # an index of its first samples
    with pytest.raises(ShardError, match=r"bad\.tar.*at offset \d+"):
        _epoch([good, str(bad)], cache=tmp_path / "cache")  # is still an error under raise


def test_garbage_in_the_middle_of_a_shard_under_skip(tmp_path: Path) -> None:
    good = _tar(tmp_path / "good.tar", _members(KEYS))
    raw = bytearray(Path(good).read_bytes())
    header = scan_tar(good)[4].members[0].offset - 512
    raw[header: header + 512] = b"\x07" * 512
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match=rf"at offset {header}: a block that is not a valid tar header"):
        got, loader = _epoch(str(bad), on_error="skip", cache=tmp_path / "cache")
    assert got == EXPECTED[:4]
    assert [s["key"] for s in loader.skipped_samples()] == [UNKNOWN_KEY]


def test_a_wholly_unreadable_shard_under_skip_leaves_the_others(tmp_path: Path) -> None:
    good = _tar(tmp_path / "good.tar", _members(KEYS))
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar at all " * 100)
    with pytest.warns(UserWarning, match="not a readable tar"):
        got, loader = _epoch([good, str(bad)], on_error="skip", cache=tmp_path / "cache")
    assert got == EXPECTED and [s["key"] for s in loader.skipped_samples()] == [UNKNOWN_KEY]
    with pytest.raises(ShardError, match=r"no sample of the 1 shard\(s\) can be read.*bad\.tar.*not a readable tar"):
        _epoch(str(bad), on_error="skip", cache=tmp_path / "cache")


# --- item 8: compressed shards ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("name", ["s.tar.gz", "s.tgz"])
def test_a_gzip_shard_is_refused_with_how_to_unpack_it(tmp_path: Path, name: str, on_error: str) -> None:
    """Was: 'not a readable tar file (invalid header)'."""
    shard = tmp_path / name
    shard.write_bytes(gzip.compress(Path(_tar(tmp_path / "plain.tar", _members(KEYS))).read_bytes()))
    with pytest.raises(ShardError, match=rf"{name}.*gzip-compressed.*uncompressed tar files only.*gunzip -k"):
        _epoch(str(shard), on_error=on_error, cache=tmp_path / "cache")


def test_a_tar_whose_first_name_starts_like_a_magic_number_is_a_tar(tmp_path: Path) -> None:
    shard = _tar(tmp_path / "s.tar", [("BZh91.cls", b"1"), ("\x1f\x8bx.cls", b"2")])
    assert [s.key for s in scan_tar(shard)] == ["BZh91", "\x1f\x8bx"]


# --- item 9: adjacent copies of one key -----------------------------------------------------------------------------

@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_two_adjacent_copies_of_a_key_warn_and_count(tmp_path: Path, on_error: str) -> None:
    """Was: the second copy dropped with no warning."""
    shard = _tar(tmp_path / "s.tar", _members(["k0", "k1"]) + _members(["k1"], labels=[7]) + _members(["k2"]))
    with pytest.warns(UserWarning, match=r"s\.tar.*1 sample\(s\) repeat a key.*'k1'"):
        got, loader = _epoch(shard, on_error=on_error, cache=tmp_path / "cache")
    assert got == [("k0", 0), ("k1", 1), ("k2", 2)]
    assert [(s["key"], "only the first" in s["reason"]) for s in loader.skipped_samples()] == [("k1", True)]
    assert loader.stats()["skipped"] == 1


# --- shards inspect --check reports each of them ----------------------------------------------------------------------

def test_inspect_reports_every_kind_of_damage_the_loader_would_meet(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    short = _tar(data / "short.tar", _members(KEYS))
    load_index(short, tmp_path / "cache")
    _write_rows(default_index_path(short), "v1.2 10", _rows(default_index_path(short))[:5])
    swapped = _tar(data / "swapped.tar", _members(KEYS))
    load_index(swapped, tmp_path / "cache")
    rows = _rows(default_index_path(swapped))
    rows[0][5:7], rows[1][5:7] = rows[1][5:7], rows[0][5:7]
    _write_rows(default_index_path(swapped), "v1.2 10", rows)
    rewritten = data / "rewritten.tar"
    _tar(rewritten, _members(KEYS))
    load_index(str(rewritten), tmp_path / "cache")
    st = rewritten.stat()
    _tar(rewritten, _members(KEYS, labels=[9 - i for i in range(10)]))
    os.utime(rewritten, ns=(st.st_atime_ns, st.st_mtime_ns))
    cut = data / "cut.tar"
    cut.write_bytes(Path(short).read_bytes()[: _cuts(Path(short))["member boundary"]])
    repeated = _tar(data / "repeated.tar", _members(["k0", "k1"]) + _members(["k1"]))
    packed = data / "packed.tar.gz"
    packed.write_bytes(gzip.compress(Path(short).read_bytes()))
    monkeypatch.setenv("FEEDFAST_CACHE", str(tmp_path / "cache"))
    shards = [short, swapped, str(rewritten), str(cut), repeated, str(packed)]
    assert main(["shards", "inspect", *shards, "--json", "--check"]) == 0
    problems = json.loads(capsys.readouterr().out)["problems"]

    def about(name: str) -> str:
        return "\n".join(p for p in problems if p.startswith(str(data / name)))

    assert "declares 10 samples on its first line but lists 5" in about("short.tar")
    assert "'k0.cls'" in about("swapped.tar") and "that of 'k1.cls'" in about("swapped.tar")
    assert "content fingerprint differs" in about("rewritten.tar")
    assert "no end-of-archive" in about("cut.tar") and "under on_error: skip the 7 complete" in about("cut.tar")
    assert "key 'k1' repeats" in about("repeated.tar")
    assert "gzip-compressed" in about("packed.tar.gz") and "gunzip" in about("packed.tar.gz")
    assert all("indexes the shard again" in about(n) for n in ("short.tar", "swapped.tar", "rewritten.tar"))


# --- issue 37 item 9: an empty shard under skip is a skipped shard -------------------------------------------------

def test_an_empty_shard_under_skip_is_counted_and_named_and_its_neighbour_read(tmp_path: Path) -> None:
    """Was: 'shard holds no samples' raised at construction under skip, the good shard lost with it."""
    good = _tar(tmp_path / "good.tar", _members(KEYS))
    empty = _tar(tmp_path / "empty.tar", [])
    with pytest.warns(UserWarning, match=r"holds no samples: .*empty\.tar.*skipping it \(on_error: skip\)"):
        got, loader = _epoch([good, empty], on_error="skip", cache=tmp_path / "cache")
    assert got == EXPECTED
    [(shard, key, reason)] = [tuple(s.values()) for s in loader.skipped_samples()]
    assert (shard, key) == (empty, UNKNOWN_KEY) and "holds no samples" in reason
    with pytest.raises(ShardError, match=r"shard holds no samples: .*empty\.tar"):
        _epoch([good, empty], on_error="raise", cache=tmp_path / "cache")


# --- issue 37 item 7: a member whose key is empty ----------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_members_with_an_empty_base_name_before_the_dot_are_delivered_not_dropped(tmp_path: Path,
                                                                                  backend: str) -> None:
    """Was: ``.cls`` and ``dir/.cls`` dropped silently (10 of 12 delivered, 0 skipped). ``dir/.cls`` is the sample
    ``dir/``, as WebDataset reads it; ``.cls`` at the root is the sample of the empty key, delivered and named."""
    members = _members(KEYS[:5]) + [(".txt", b"root"), (".cls", b"10"), ("dir/.txt", b"dir"), ("dir/.cls", b"11")]
    shard = _tar(tmp_path / "s.tar", members + _members(KEYS[5:]))
    got, loader = _epoch(shard, backend=backend, cache=tmp_path / "cache")
    assert got == EXPECTED[:5] + [("", 10), ("dir/", 11)] + EXPECTED[5:]
    assert loader.stats()["skipped"] == 0


# --- issue 37 item 8: an index that covers only part of its tar ------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_that_stops_before_the_tars_last_member_is_rebuilt(tmp_path: Path, backend: str) -> None:
    """Was: an index of 5 of the tar's 10 samples, with no fingerprint and a header that agrees, delivered 5 silently."""
    shard = _tar(tmp_path / "s.tar", _members(KEYS))
    load_index(shard, tmp_path / "cache")
    index = default_index_path(shard)
    _write_rows(index, "v1.2 5", _rows(index)[:5])
    with pytest.warns(UserWarning, match=r"s\.idx.*does not describe.*the tar goes on after the last member it lists "
                                         r"\(a member header at offset \d+\)"):
        got, loader = _epoch(shard, backend=backend, cache=tmp_path / "cache")
    assert got == EXPECTED and loader.stats()["skipped"] == 0
    assert len(read_index(index, shard)) == 10


def test_an_index_of_a_tar_ending_in_a_folder_or_link_is_trusted(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    _tar(shard, _members(KEYS))
    with tarfile.open(shard, "a") as tar:  # members that hold no sample after the last one: the index is whole
        folder = tarfile.TarInfo("dir")
        folder.type = tarfile.DIRTYPE
        link = tarfile.TarInfo("k0.lnk")
        link.type, link.linkname = tarfile.SYMTYPE, "k0.txt"
        tar.addfile(folder)
        tar.addfile(link)
    load_index(shard, tmp_path / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, _ = _epoch(str(shard), cache=tmp_path / "cache")
    assert got == EXPECTED


# --- issue 37 item 2: an index whose entries point at another sample's members ------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_with_two_samples_label_entries_swapped_is_rebuilt(tmp_path: Path, backend: str) -> None:
    """Was: labels [1, 0, 2, ...] delivered under on_error: raise, no error, no warning: each entry (name, offset,
    size) was a real member, just another sample's."""
    shard = _tar(tmp_path / "s.tar", _members(KEYS))
    load_index(shard, tmp_path / "cache")
    index = default_index_path(shard)
    rows = _rows(index)
    rows[0][4:8], rows[1][4:8] = rows[1][4:8], rows[0][4:8]  # k0's line lists k1.cls, k1's lists k0.cls
    _write_rows(index, "v1.2 10", rows)
    with pytest.warns(UserWarning, match=r"s\.idx.*does not describe.*'k1\.cls' at offset \d+.*is listed with "
                                         r"sample 'k0'"):
        got, _ = _epoch(shard, backend=backend, cache=tmp_path / "cache")
    assert got == EXPECTED


@pytest.mark.parametrize("backend", BACKENDS)
def test_swapped_offsets_of_long_names_in_a_local_index_are_caught(tmp_path: Path, backend: str) -> None:
    """Names over 100 bytes live in PAX headers; the plain header holds their start, key included: checked."""
    keys = [f"{'d' * 40}/{i:04d}-{'n' * 70}" for i in range(10)]  # the number inside the first 100 bytes
    shard = _tar(tmp_path / "s.tar", _members(keys, labels=list(range(10))))
    load_index(shard, tmp_path / "cache")
    index = default_index_path(shard)
    rows = _rows(index)
    rows[0][5:7], rows[1][5:7] = rows[1][5:7], rows[0][5:7]  # the .cls offsets (and sizes) of samples 0 and 1 swapped
    _write_rows(index, "v1.2 10", rows)
    with pytest.warns(UserWarning, match=r"s\.idx.*does not describe.*0000-n+\.cls' at offset \d+: the header before it "
                                         r"holds 'd+/0001-n+', the start of another member the index lists"):
        got, _ = _epoch(shard, backend=backend, cache=tmp_path / "cache")
    assert got == list(zip(keys, range(10)))
