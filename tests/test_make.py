"""feedfast shards make: image folders and lists to indexed shards that the loader reads."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import feedfast
from feedfast.cli.main import main
from feedfast.errors import UserError
from feedfast.write.make import parse_size

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
    assert sorted(labels) == [3, 7]
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


def test_a_folder_holding_shards_is_refused_unless_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tree(tmp_path / "t")
    out = tmp_path / "o"
    assert main(["shards", "make", str(tmp_path / "t"), str(out), "--per-shard", "2"]) == 0
    old = sorted(p.name for p in out.glob("*.tar"))
    assert len(old) == 5
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["shards", "make", str(tmp_path / "t"), str(out), "--per-shard", "9"]) == 2
    err = capsys.readouterr().err
    assert "already holds shards" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in out.glob("*.tar")) == old  # nothing was touched
    assert main(["shards", "make", str(tmp_path / "t"), str(out), "--per-shard", "9", "--overwrite"]) == 0
    assert sorted(p.name for p in out.glob("*.tar")) == ["train-0000.tar"]
    assert sorted(p.name for p in out.glob("*.idx")) == ["train-0000.idx"]
    assert (out / "notes.txt").read_text() == "mine"  # only shards, indexes and classes.json are removed
    capsys.readouterr()
    assert main(["shards", "inspect", str(out / "*.tar"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 9


def _tar(path: Path, members: list[tuple[str, bytes]]) -> str:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_inspect_reports_duplicates_labels_and_undecodable_images(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from tests.corpus import hostile_images

    images = hostile_images()
    jpeg, gif, trunc = images["jpeg"][0], images["gif"][0], images["jpeg_truncated"][0]
    shard = _tar(tmp_path / "d.tar", [("a.jpg", jpeg), ("a.cls", b"1"), ("b.jpg", gif), ("b.cls", b"-2"),
                                      ("a.jpg", jpeg), ("a.cls", b"1"), ("c.jpg", trunc), ("c.cls", b"cat")])
    assert main(["shards", "inspect", shard, "--json", "--check"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 3  # what the loader reads: the repeated `a` is not counted twice
    problems = "\n".join(report["problems"])
    assert "key 'a' repeats" in problems and "only the first" in problems
    assert "negative label -2" in problems and "label 'cat' is not an integer" in problems
    assert "sample 'c'" in problems and "truncated" in problems and "left out under on_error: skip" in problems
    assert "sample 'b'" in problems and "re-encoded" in problems


def test_a_repeated_key_is_delivered_once(tmp_path: Path) -> None:
    from tests.corpus import hostile_images

    jpeg = hostile_images()["jpeg"][0]
    shard = _tar(tmp_path / "d.tar", [("a.jpg", jpeg), ("a.cls", b"1"), ("b.jpg", jpeg), ("b.cls", b"2"),
                                      ("a.jpg", jpeg), ("a.cls", b"3")])
    with pytest.warns(UserWarning, match="repeat a key"):
        loader = feedfast.DataLoader(SPEC, shards=shard, batch_size=1)
    got = [(k, int(y)) for _, ys in loader for (_, k), y in zip(loader.last_origins, ys)]
    assert got == [("a", 1), ("b", 2)]


def _sorted_tree(root: Path, classes: int, per_class: int) -> None:
    from PIL import Image

    for c in range(classes):
        (root / f"c{c:02d}").mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (c * 20, i * 10, 0)).save(root / f"c{c:02d}" / f"{i}.jpg")


def test_make_shuffles_across_shards_by_default_and_inspect_warns_on_sorted_shards(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _sorted_tree(tmp_path / "tree", classes=8, per_class=10)
    assert main(["shards", "make", str(tmp_path / "tree"), str(tmp_path / "sorted"), "--per-shard", "10",
                 "--no-shuffle"]) == 0
    assert main(["shards", "make", str(tmp_path / "tree"), str(tmp_path / "mixed"), "--per-shard", "10"]) == 0
    assert "shuffled across shards (seed 0)" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["shards", "inspect", str(tmp_path / "sorted" / "*.tar"), "--json"]) == 0
    sorted_report = json.loads(capsys.readouterr().out)
    assert [s["distinct_labels"] for s in sorted_report["shards"]] == [1] * 8
    assert sorted_report["label_mixing"]["ratio"] < 0.3
    assert any("class-sorted" in p for p in sorted_report["problems"])
    assert main(["shards", "inspect", str(tmp_path / "mixed" / "*.tar"), "--json"]) == 0
    mixed = json.loads(capsys.readouterr().out)
    assert mixed["label_mixing"]["ratio"] > 0.8 and not any("class-sorted" in p for p in mixed["problems"])
    got = Counter(int(y) for _, ys in feedfast.DataLoader(SPEC, shards=str(tmp_path / "mixed" / "*.tar")) for y in ys)
    assert got == Counter({c: 10 for c in range(8)})  # every sample once, whatever the order
