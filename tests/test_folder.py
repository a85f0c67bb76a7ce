"""Images read in place (``shards=`` a folder or a file list, :mod:`feedfast.sources.folder`) on the CPU paths.

Labels and classes against torchvision's ``ImageFolder``; every file once per epoch over 1, 2 and 3
ranks (spawned processes); the permutation shuffle; bit-exact and elastic resume; ``on_error``
with skips naming the file; a changed file named; DALI through its feed (under ``on_error: raise``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import feedfast
from feedfast.errors import SampleError, UserError
from tests.helpers import ROOT, SMALL_SPEC, rank_report, spawn_ranks

CLASSES = ("a b", "cat", "dog.x", ".hidden")  # a space, a dot, a hidden class folder


def _jpeg(path: Path, seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (40 + seed % 9, 48, 3), dtype=np.uint8)).save(path, quality=90)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """14 JPEGs in 4 classes, nested folders, odd names, a non-image file (left out, as torchvision does)."""
    root = tmp_path_factory.mktemp("folder") / "train"
    n = 0
    for c in CLASSES:
        for name in ("1.jpg", "sub/2.JPG", "sub/deeper/3.jpeg", "z 4.jpg")[: 3 + (c == "cat") * 1 + (c == "a b") * 1]:
            _jpeg(root / c / name, n)
            n += 1
        (root / c / "notes.txt").write_text("not an image")
    return root


def _loader(shards: Any, **kw: Any) -> feedfast.DataLoader:
    kw = {"batch_size": 4, "device": "cpu", "backend": "threads", "num_workers": 2, **kw}
    return feedfast.DataLoader(SMALL_SPEC, shards=str(shards), **kw)


def _epoch(loader: feedfast.DataLoader) -> tuple[list[tuple[str, int]], list[torch.Tensor]]:
    """(key, label) of every valid sample in order, and the image batches."""
    seen, images = [], []
    for image, label in loader:
        valid = loader.last_valid
        seen += [(key, int(v)) for (_, key), v in zip(loader.last_origins[:valid], label[:valid].tolist())]
        images.append(image.clone())
    return seen, images


def test_labels_and_classes_are_torchvisions(folder: Path) -> None:
    from torchvision.datasets import ImageFolder

    theirs = ImageFolder(str(folder))
    loader = _loader(folder, shuffle=False)
    assert loader.dataset.classes == theirs.classes
    assert loader.dataset.class_to_idx == theirs.class_to_idx
    seen, _ = _epoch(loader)
    assert [(str(folder / key), label) for key, label in seen] == theirs.samples
    assert len(loader.dataset) == len(theirs)


@pytest.mark.parametrize("form", ["txt", "csv"])
def test_a_file_list_reads_its_labels(folder: Path, tmp_path: Path, form: str) -> None:
    files = sorted(p.relative_to(folder) for p in folder.rglob("*.jpg"))
    listing = tmp_path / f"train.{form}"
    sep = "," if form == "csv" else " "
    listing.write_text("".join(f"{folder / f}{sep}{i % 5}\n" for i, f in enumerate(files)))
    seen, _ = _epoch(_loader(listing, shuffle=False))
    assert seen == [(str(folder / f), i % 5) for i, f in enumerate(files)]
    assert not hasattr(_loader(listing).dataset, "classes")  # a list has labels, no class names


def test_shuffle_is_a_permutation_fixed_by_seed(folder: Path) -> None:
    plain, _ = _epoch(_loader(folder, shuffle=False))
    first, _ = _epoch(_loader(folder, shuffle=True, seed=5))
    again, _ = _epoch(_loader(folder, shuffle=True, seed=5))
    assert sorted(first) == sorted(plain) and first != plain and first == again


def test_resume_is_bit_exact_and_elastic(folder: Path) -> None:
    whole = _loader(folder, shuffle=True, seed=2)
    keys, images = _epoch(whole)
    first = _loader(folder, shuffle=True, seed=2)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    resumed = _loader(folder, shuffle=True, seed=2)
    resumed.load_state_dict(state)
    rest_keys, rest = _epoch(resumed)
    assert rest_keys == keys[8:]
    assert all(torch.equal(a, b) for a, b in zip(rest, images[2:]))
    # elastic: the same state taken at one rank resumes at two; together they read the rest once
    halves = [_loader(folder, shuffle=True, seed=2, rank=r, world_size=2) for r in range(2)]
    for h in halves:
        h.load_state_dict(state)
    read = [k for h in halves for k in _epoch(h)[0]]
    assert sorted(read) == sorted(keys[8:])


def test_dali_reads_a_folder_as_the_threaded_path_does(folder: Path) -> None:
    """The same samples, labels and order (the global permutation), through DALI's feed (its packed reads) and one
    pipeline; on the CPU here, as a GPU-placed loader reads it."""
    threads, _ = _epoch(_loader(folder, shuffle=True, seed=4))
    dali_loader = _loader(folder, shuffle=True, seed=4, backend="dali", placement="cpu")
    dali, images = _epoch(dali_loader)
    assert dali == threads and len(dali) == 14
    assert all(x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32) and torch.isfinite(x).all() for x in images)
    assert dali_loader.dataset.classes == sorted(CLASSES)


def test_dali_names_a_file_changed_since_it_was_listed(folder: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "train"
    shutil.copytree(folder, copy)
    loader = _loader(copy, shuffle=False, backend="dali", placement="cpu")
    _jpeg(copy / "cat" / "1.jpg", 99)  # another image, another size
    with pytest.raises(feedfast.FeedfastError, match="cat/1.jpg"):
        _epoch(loader)


def test_dali_under_skip_is_refused_with_the_fix(folder: Path) -> None:
    with pytest.raises(UserError, match="on_error: raise"):
        _loader(folder, backend="dali", placement="cpu", on_error="skip")


def test_a_spec_component_a_folder_cannot_give_is_refused(folder: Path) -> None:
    spec = {**SMALL_SPEC, "source": {"components": {"image": {"ext": "jpg", "kind": "image"},
                                                    "meta": {"ext": "json", "kind": "json"}}},
            "pipeline": {"image": SMALL_SPEC["pipeline"]["image"]}, "outputs": ["image"]}
    with pytest.raises(UserError, match="'meta'"):
        feedfast.DataLoader(spec, shards=str(folder), device="cpu", backend="threads")


@pytest.mark.parametrize("backend", ["threads", "pil"])
def test_a_bad_file_is_named_or_skipped_and_counted(folder: Path, tmp_path: Path, backend: str) -> None:
    import shutil

    root = tmp_path / "train"
    shutil.copytree(folder, root)
    (root / "cat" / "1.jpg").write_bytes(b"not a jpeg at all")  # undecodable (listed afresh: a new folder)
    with pytest.raises(SampleError, match=r"cat/1\.jpg") as raised:
        _epoch(_loader(root, shuffle=False, backend=backend))
    assert raised.value.shard == str(root)
    skipping = _loader(root, shuffle=False, backend=backend, on_error="skip")
    seen, _ = _epoch(skipping)
    assert len(seen) == 13 and "cat/1.jpg" not in {k for k, _ in seen}
    assert skipping.stats()["skipped"] == 1
    assert skipping.skipped_samples()[0]["key"] == "cat/1.jpg"


def test_a_changed_file_is_named(folder: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "train"
    shutil.copytree(folder, root)
    loader = _loader(root, shuffle=False)
    target = root / "dog.x" / "sub" / "2.JPG"
    target.write_bytes(target.read_bytes() + b"\0" * 10)  # rewritten in place after the listing
    with pytest.raises(SampleError, match=r"dog\.x/sub/2\.JPG.*bytes now"):
        _epoch(loader)


def test_pil_backend_reads_the_same_samples(folder: Path) -> None:
    threads, _ = _epoch(_loader(folder, shuffle=True, seed=1))
    pil, _ = _epoch(_loader(folder, shuffle=True, seed=1, backend="pil", num_workers=0))
    assert pil == threads


def _rank(rank: int, world: int, folder: str, out: str) -> None:
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))

    def body() -> dict[str, Any]:
        loader = _loader(folder, shuffle=True, seed=4, rank=rank, world_size=world, num_workers=1)
        seen, _ = _epoch(loader)
        return {"keys": [k for k, _ in seen], "len": len(loader)}

    rank_report(out, rank, body)


@pytest.mark.slow
def test_every_file_once_per_epoch_over_1_2_3_ranks(folder: Path, tmp_path: Path) -> None:
    everything = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    for world in (1, 2, 3):
        out = tmp_path / f"w{world}"
        out.mkdir()
        records = spawn_ranks(_rank, world, out, lambda r, w=world, o=out: (r, w, str(folder), str(o)), timeout_s=180)
        keys = [k for r in records for k in r["keys"]]
        assert sorted(keys) == everything, world
        assert len({r["len"] for r in records}) == 1  # equal batch counts on every rank


def test_dali_names_a_file_it_cannot_decode_and_says_where_skip_runs(folder: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "train"
    shutil.copytree(folder, copy)
    (copy / "dog.x" / "1.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a JPEG at all" * 8)
    loader = _loader(copy, shuffle=False, backend="dali", placement="cpu")
    with pytest.raises(SampleError, match=r"dog\.x/1\.jpg.*backend='threads' or 'pil'"):
        _epoch(loader)
