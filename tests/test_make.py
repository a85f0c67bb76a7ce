"""feedfast shards make: image folders and lists to indexed shards that the loader reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import feedfast
from feedfast.cli.main import main
from feedfast.errors import UserError
from feedfast.sources.make import parse_size

SPEC = {"pipeline": {"image": ["decode", {"resize": {"size": [16, 16]}}, "normalize"], "label": ["label"]},
        "source": {"components": {"image": {"ext": "jpg;jpeg;png", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}}},
        "batch": {"size": 4}}


def _tree(root: Path) -> dict[str, int]:
    rng = np.random.default_rng(0)
    want = {}
    for label, cls in enumerate(["cat", "dog", "zebra"]):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            name = f"img.{i}.jpeg" if cls == "dog" else f"img {i}.png" if cls == "zebra" else f"{i}.JPG"
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(
                root / cls / name, "PNG" if name.endswith("png") else "JPEG")
            want[f"{cls}/{Path(name).stem}".replace(".", "_").replace(" ", "_")] = label
    return want


def test_folder_tree_to_shards_read_back_exactly(tmp_path: Path) -> None:
    want = _tree(tmp_path / "train")
    assert main(["shards", "make", str(tmp_path / "train"), str(tmp_path / "out"), "--per-shard", "4"]) == 0
    assert json.loads((tmp_path / "out" / "classes.json").read_text()) == ["cat", "dog", "zebra"]
    shards = sorted(str(p) for p in (tmp_path / "out").glob("*.tar"))
    assert len(shards) == 3 and all(Path(s).with_suffix(".idx").exists() for s in shards)
    loader = feedfast.DataLoader(SPEC, shards=shards, num_workers=1)
    got = {}
    for _, labels in loader:
        got.update({k: int(y) for (_, k), y in zip(loader.last_origins, labels)})
    assert got == want


def test_csv_and_jsonl_lists(tmp_path: Path) -> None:
    _tree(tmp_path / "t")
    (tmp_path / "l.csv").write_text("path,label\nt/cat/0.JPG,7\nt/dog/img.1.jpeg,3\n")
    (tmp_path / "l.jsonl").write_text('{"path": "t/cat/1.JPG", "label": 5}\n')
    assert main(["shards", "make", str(tmp_path / "l.csv"), str(tmp_path / "a")]) == 0
    assert main(["shards", "make", str(tmp_path / "l.jsonl"), str(tmp_path / "b")]) == 0
    labels = [int(v) for _, ys in feedfast.DataLoader(SPEC, shards=str(tmp_path / "a" / "*.tar")) for v in ys]
    assert labels == [7, 3]
    (tmp_path / "bad.csv").write_text("t/cat/0.JPG,seven\n")
    assert main(["shards", "make", str(tmp_path / "bad.csv"), str(tmp_path / "c")]) == 2
    (tmp_path / "missing.csv").write_text("nope.jpg,1\n")
    assert main(["shards", "make", str(tmp_path / "missing.csv"), str(tmp_path / "d")]) == 2


def test_shard_size_limit_closes_shards(tmp_path: Path) -> None:
    _tree(tmp_path / "t")
    assert main(["shards", "make", str(tmp_path / "t"), str(tmp_path / "o"), "--shard-size", "3k"]) == 0
    shards = sorted((tmp_path / "o").glob("*.tar"))
    assert len(shards) >= 3
    loader = feedfast.DataLoader(SPEC, shards=[str(p) for p in shards])
    assert sum(len(ys) for _, ys in loader) == 9


def test_shard_size_limit_and_parse() -> None:
    assert parse_size("256MB") == 256 * 2**20 and parse_size("1.5GiB") == int(1.5 * 2**30) and parse_size("100") == 100
    with pytest.raises(UserError, match="256MB"):
        parse_size("lots")
