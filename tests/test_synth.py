"""Tests for feedfast.write.synth: synthetic images and deterministic WebDataset shards."""

from __future__ import annotations

import io
import pathlib
import tarfile

import numpy as np
import pytest
from PIL import Image

from feedfast.errors import UserError
from feedfast.write.synth import make_image, synth_shards

SMALL = {"samples": 12, "per_shard": 5, "min_side": 64, "max_side": 96, "num_classes": 7}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[pathlib.Path]:
    """One small synthetic dataset shared by the read-only tests."""
    return synth_shards(tmp_path_factory.mktemp("synth"), seed=3, **SMALL)


def _members(path: pathlib.Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        out = []
        for info in tar.getmembers():
            handle = tar.extractfile(info)
            assert handle is not None
            out.append((info, handle.read()))
        return out


def test_make_image_size_mode_and_not_flat() -> None:
    img = make_image(np.random.default_rng(0), 123, 77)
    assert img.size == (123, 77) and img.mode == "RGB"
    arr = np.asarray(img, dtype=np.float32)
    assert arr.std() > 10.0  # not flat colour
    # Photo-like: neighbouring pixels are strongly correlated, unlike pure noise.
    diff = np.abs(np.diff(arr, axis=1)).mean()
    assert diff < 0.5 * arr.std()


def test_make_image_is_pure_function_of_rng() -> None:
    a = make_image(np.random.default_rng(5), 50, 40)
    b = make_image(np.random.default_rng(5), 50, 40)
    c = make_image(np.random.default_rng(6), 50, 40)
    assert a.tobytes() == b.tobytes() and a.tobytes() != c.tobytes()


def test_make_image_jpeg_size_resembles_photos() -> None:
    rng = np.random.default_rng(0)
    sizes = []
    for _ in range(4):
        buffer = io.BytesIO()
        make_image(rng, 400, 350).save(buffer, format="JPEG", quality=90)
        sizes.append(len(buffer.getvalue()))
    assert 25_000 <= np.mean(sizes) <= 90_000, sizes


@pytest.mark.parametrize("width,height", [(0, 10), (10, 0)])
def test_make_image_rejects_empty(width: int, height: int) -> None:
    with pytest.raises(UserError, match="must be >= 1"):
        make_image(np.random.default_rng(0), width, height)


def test_shard_names_count_and_membership(shards: list[pathlib.Path]) -> None:
    assert [p.name for p in shards] == ["train-0000.tar", "train-0001.tar", "train-0002.tar"]
    names = [[info.name for info, _ in _members(p)] for p in shards]
    assert [len(n) for n in names] == [10, 10, 4]
    flat = [n for shard in names for n in shard]
    expected = []
    for g in range(12):
        expected += [f"train-{g:08d}.jpg", f"train-{g:08d}.cls"]
    assert flat == expected
    keys = [n.rsplit(".", 1)[0] for n in flat[::2]]
    assert keys == sorted(keys) and len(set(keys)) == 12
    assert not list(shards[0].parent.glob("*.tmp"))


def test_member_metadata_is_fixed(shards: list[pathlib.Path]) -> None:
    for info, _ in _members(shards[0]):
        assert (info.mtime, info.mode, info.uid, info.gid) == (0, 0o644, 0, 0)
        assert (info.uname, info.gname) == ("", "")


def test_images_decode_sizes_and_labels(shards: list[pathlib.Path]) -> None:
    labels = []
    for path in shards:
        members = _members(path)
        for (_, jpg), (_, cls) in zip(members[::2], members[1::2]):
            img = Image.open(io.BytesIO(jpg))
            img.load()
            assert img.format == "JPEG" and img.mode == "RGB"
            short, long = sorted(img.size)
            assert 64 <= short <= 96
            assert long <= round(short * 4 / 3) + 1
            assert cls.decode("ascii").isdigit() and not cls.endswith(b"\n")
            labels.append(int(cls))
    assert all(0 <= lab < 7 for lab in labels) and len(set(labels)) > 1


def test_same_seed_byte_identical_other_seed_differs(tmp_path: pathlib.Path) -> None:
    args = {**SMALL, "samples": 6}
    a = synth_shards(tmp_path / "a", seed=1, **args)
    b = synth_shards(tmp_path / "b", seed=1, **args)
    c = synth_shards(tmp_path / "c", seed=2, **args)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert a[0].read_bytes() != c[0].read_bytes()


def test_sample_independent_of_sharding(tmp_path: pathlib.Path) -> None:
    a = synth_shards(tmp_path / "a", **{**SMALL, "samples": 4, "per_shard": 4})
    b = synth_shards(tmp_path / "b", **{**SMALL, "samples": 4, "per_shard": 1})
    data_a = [d for _, d in _members(a[0])]
    data_b = [d for p in b for _, d in _members(p)]
    assert data_a == data_b


@pytest.mark.parametrize(
    "override,name",
    [
        ({"samples": 0}, "samples"),
        ({"per_shard": 0}, "per_shard"),
        ({"min_side": 0}, "min_side"),
        ({"min_side": 100, "max_side": 99}, "max_side"),
        ({"num_classes": 0}, "num_classes"),
        ({"quality": 101}, "quality"),
        ({"seed": -1}, "seed"),
        ({"samples": 2.5}, "samples"),
        ({"prefix": ""}, "prefix"),
        ({"prefix": "a/b"}, "prefix"),
        ({"prefix": "a.b"}, "prefix"),
    ],
)
def test_bad_arguments_raise_user_error(tmp_path: pathlib.Path, override: dict, name: str) -> None:
    with pytest.raises(UserError, match=name) as info:
        synth_shards(tmp_path, **{**SMALL, **override})
    assert "got" in str(info.value)
    assert not list(tmp_path.iterdir())


def test_out_dir_that_is_a_file_raises(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(UserError, match="out_dir"):
        synth_shards(target, **SMALL)
