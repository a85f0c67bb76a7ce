"""Hostile labels, JSON and .npy components under both policies on every backend.

A label that is not a plain integer within int64 (and JSON that does not parse, a .npy that
does not load or cast) is a SampleError naming shard, key and the bytes seen under ``raise``,
and a counted, listed skip under ``skip``; never a raw exception, never a stopped epoch,
never a wrong label.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

import feedfast
from feedfast.errors import SampleError

BACKENDS = ["threads", "pil", "dali"]

BAD_LABELS = {
    "overflow": b"9223372036854775808",
    "underflow": b"-9223372036854775809",
    "float": b"42.0",
    "hex": b"0x2a",
    "bom": b"\xef\xbb\xbf42",
    "nul": b"4\x002",
    "empty": b"",
    "underscore": b"4_2",  # int() takes it as 42
    "long": b"9" * 5000,  # past int()'s 4300 digits
}
GOOD_LABELS = {"g0": (b"0", 0), "g1": (b"1\n", 1), "g2": (b" +2 ", 2), "g3": (b"003", 3),
               "gmax": (b"9223372036854775807", 2**63 - 1)}


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _jpeg() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (40, 40), (120, 30, 200)).save(out, "JPEG")
    return out.getvalue()


GOOD_META, GOOD_FEAT = b'{"id": 7}', _npy(np.arange(3, dtype=np.int64))
BAD_OTHER = {  # key -> (component, bytes)
    "json_cut": ("json", b'{"id": '),
    "json_nul": ("json", b"\x00"),
    "npy_junk": ("npy", b"\x93NUMPY garbage"),
    "npy_nan": ("npy", _npy(np.array([np.nan, 1.0, 2.0]))),  # cast to int64 would wrap silently
    "npy_big": ("npy", _npy(np.array([2.0**63, 0.0, 1.0]))),
}


def _spec(on_error: str) -> dict:
    return {
        "version": 1, "name": "hostile-labels",
        "source": {"components": {"image": {"ext": "jpg", "kind": "image"}, "label": {"ext": "cls", "kind": "label"},
                                  "meta": {"ext": "json", "kind": "json"}, "feat": {"ext": "npy", "kind": "npy"}},
                   "on_error": on_error},
        "pipeline": {"image": ["decode", {"resize": {"size": 16}}, {"center_crop": {"size": 16}}, "normalize"],
                     "label": ["label"], "meta": [{"json": {"field": "id"}}], "feat": [{"npy": {"dtype": "int64"}}]},
        "outputs": ["image", "label", "meta", "feat"], "batch": {"size": 4}, "seed": 0, "device": "cpu",
    }


def _shard(path: Path, bad: dict[str, tuple[str, bytes]]) -> str:
    """Good samples, then one sample per ``bad`` entry with that component replaced."""
    jpeg = _jpeg()
    rows = [(key, raw, GOOD_META, GOOD_FEAT) for key, (raw, _) in GOOD_LABELS.items()]
    for key, (component, data) in bad.items():
        rows.append((key, data if component == "cls" else b"5", data if component == "json" else GOOD_META,
                     data if component == "npy" else GOOD_FEAT))
    with tarfile.open(path, "w") as tar:
        for key, cls, meta, feat in rows:
            for ext, payload in (("jpg", jpeg), ("cls", cls), ("json", meta), ("npy", feat)):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return str(path)


def _epoch(loader: feedfast.DataLoader) -> dict[str, int]:
    labels: dict[str, int] = {}
    for _, label, meta, feat in loader:
        valid = loader.last_valid
        for (_, key), value in zip(loader.last_origins[:valid], label[:valid].tolist()):
            assert key not in labels
            labels[key] = value
        assert list(meta[:valid]) == [7] * valid
        assert feat[:valid].tolist() == [[0, 1, 2]] * valid
    return labels


ALL_BAD = {**{k: ("cls", v) for k, v in BAD_LABELS.items()}, **BAD_OTHER}


@pytest.mark.parametrize("backend", BACKENDS)
def test_skip_leaves_out_and_lists_every_refused_sample_and_keeps_the_labels_right(tmp_path: Path,
                                                                                  backend: str) -> None:
    shard = _shard(tmp_path / "hostile.tar", ALL_BAD)
    loader = feedfast.DataLoader(_spec("skip"), shards=shard, num_workers=1, backend=backend,
                                 cache_dir=tmp_path / "cache")
    assert _epoch(loader) == {key: value for key, (_, value) in GOOD_LABELS.items()}
    report = {r["key"]: r for r in loader.skipped_samples()}
    assert sorted(report) == sorted(ALL_BAD)
    assert all(r["shard"] == shard for r in report.values())
    assert "outside int64" in report["overflow"]["reason"] and "9223372036854775808" in report["overflow"]["reason"]
    assert "42.0" in report["float"]["reason"] and "`label` failed" in report["float"]["reason"]
    assert "JSON" in report["json_cut"]["reason"] and "int64" in report["npy_nan"]["reason"]
    assert loader.stats()["skipped"] == len(ALL_BAD)
    assert loader.stats()["delivered"] == len(GOOD_LABELS)
    again = feedfast.DataLoader(_spec("skip"), shards=shard, num_workers=1, backend=backend,
                                cache_dir=tmp_path / "cache")  # from the cached verdicts and the record
    assert again.skipped_samples() == loader.skipped_samples()
    assert _epoch(again) == {key: value for key, (_, value) in GOOD_LABELS.items()}


# every case on threads; a few on the slower backends
RAISE_CASES = [("threads", case) for case in sorted(ALL_BAD)] + [
    (backend, case) for backend in ("pil", "dali") for case in ("overflow", "underscore", "bom", "json_cut", "npy_nan")]


@pytest.mark.parametrize(("backend", "case"), RAISE_CASES)
def test_raise_names_shard_key_and_the_bytes_seen(tmp_path: Path, backend: str, case: str) -> None:
    shard = _shard(tmp_path / "hostile.tar", {case: ALL_BAD[case]})
    loader = feedfast.DataLoader(_spec("raise"), shards=shard, num_workers=1, backend=backend,
                                 cache_dir=tmp_path / "cache")
    with pytest.raises(SampleError) as info:
        _epoch(loader)
    assert (info.value.shard, info.value.key) == (shard, case)
    seen = ALL_BAD[case][1]
    if ALL_BAD[case][0] == "cls":
        assert repr(seen[:40]) in info.value.reason


def test_a_label_offset_that_takes_a_label_out_of_int64_is_refused(tmp_path: Path) -> None:
    spec = _spec("skip")
    spec["pipeline"]["label"] = [{"label": {"offset": -1}}]
    shard = _shard(tmp_path / "hostile.tar", {})
    loader = feedfast.DataLoader(spec, shards=shard, num_workers=1, backend="threads", cache_dir=tmp_path / "cache")
    assert [r["key"] for r in loader.skipped_samples()] == ["gmax"]
    assert _epoch(loader) == {key: value + 1 for key, (_, value) in GOOD_LABELS.items() if key != "gmax"}


def test_only_fields_whose_ops_can_refuse_bytes_are_read_when_opening() -> None:
    from feedfast.checks.labels import host_fields
    from feedfast.spec import load_spec

    spec = _spec("skip")
    spec["source"]["components"]["raw"] = {"ext": "txt", "kind": "bytes"}
    spec["pipeline"]["raw"] = ["bytes"]
    spec["outputs"].append("raw")
    assert [f.name for f in host_fields(load_spec(spec))] == ["label", "meta", "feat"]


def test_the_cli_names_the_sample_and_skips_it_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from feedfast.cli.main import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec("raise")))
    shard = _shard(tmp_path / "hostile.tar", {"overflow": ("cls", BAD_LABELS["overflow"])})
    args = ["bench", str(spec), "--shards", shard, "--batches", "2", "--warmup", "0", "--backend", "threads"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err and "sample 'overflow'" in err and "outside int64" in err
    assert main([*args, "--on-error", "skip"]) == 0
