"""A crawl's worth of hostile files: every sample is delivered or accounted for, under both policies and backends."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import torch

import feedfast
from feedfast.errors import FeedfastError, SampleError
from feedfast.sources.checkworker import CheckPool, Failed
from tests.corpus import hostile_images, write_hostile
from tests.helpers import SMALL_SPEC

MAX_PIXELS = 4_000_000
IMAGES = hostile_images()
DELIVERED = sorted(k for k, (_, e) in IMAGES.items() if e == "delivered")
SKIPPED = sorted(k for k, (_, e) in IMAGES.items() if e == "skipped")


def _spec(on_error: str) -> dict:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["source"] = {"components": {"image": {"ext": "jpg", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}},
                      "missing": "skip", "on_error": on_error}
    return spec


def _epoch(loader: feedfast.DataLoader) -> dict[str, torch.Tensor]:
    out = {}
    for x, _ in loader:
        for (_, key), img in zip(loader.last_origins[: loader.last_valid], x[: loader.last_valid]):
            assert key not in out, f"{key} delivered twice"
            out[key] = img
    return out


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_hostile(tmp_path_factory.mktemp("hostile")))


@pytest.mark.parametrize("backend", ["dali", "pil", "threads"])
def test_skip_delivers_every_decodable_file_and_lists_the_rest(hostile: str, backend: str) -> None:
    t0 = time.monotonic()
    loader = feedfast.DataLoader(_spec("skip"), shards=hostile, batch_size=4, num_workers=1, backend=backend,
                                 max_pixels=MAX_PIXELS)
    delivered = _epoch(loader)
    assert sorted(delivered) == DELIVERED
    assert all(torch.isfinite(img).all() for img in delivered.values())
    report = {r["key"]: r for r in loader.skipped_samples()}
    assert sorted(report) == SKIPPED
    assert all(r["shard"] == hostile and r["reason"] for r in report.values())
    stats = loader.stats()
    assert stats["delivered"] + stats["skipped"] == len(IMAGES)
    assert time.monotonic() - t0 < 120


# under raise only headers are checked: a file whose header is fine but whose pixels DALI
# rejects fails its batch and is named (see the last test); every other good file is delivered
RAISE_DELIVERED = [k for k in DELIVERED if k != "png_bad_crc"]


def test_raise_delivers_every_good_file(tmp_path: Path) -> None:
    shard = str(write_hostile(tmp_path, RAISE_DELIVERED))
    for backend in ("dali", "pil"):
        loader = feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=4, num_workers=1, backend=backend)
        assert sorted(_epoch(loader)) == RAISE_DELIVERED


@pytest.mark.parametrize("bad", ["zero", "garbage", "jpeg_truncated", "png_truncated", "gif_truncated",
                                 "tga_truncated", "sgi_truncated", "dds_dxgi93", "junk_before_soi"])
def test_raise_names_shard_key_and_reason(tmp_path: Path, bad: str) -> None:
    shard = str(write_hostile(tmp_path, ["jpeg", bad, "png16"]))
    with pytest.raises(SampleError) as info:
        loader = feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=4, num_workers=1)
        _epoch(loader)
    assert info.value.shard == shard and info.value.key == bad and info.value.reason
    assert "Critical error" not in info.value.reason  # the decoder's own reason, not DALI's wrapper


def test_raise_under_the_pil_backend_names_shard_and_key(tmp_path: Path) -> None:
    shard = str(write_hostile(tmp_path, ["jpeg", "jpeg_truncated", "png16"]))
    with pytest.raises(FeedfastError) as info:
        _epoch(feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=4, num_workers=0, backend="pil"))
    assert shard in str(info.value) and "jpeg_truncated" in str(info.value)


def test_a_file_dali_rejects_but_pil_reads_is_delivered_under_raise_named_if_not(tmp_path: Path) -> None:
    shard = str(write_hostile(tmp_path, ["jpeg", "png_bad_crc"]))
    loader = feedfast.DataLoader(_spec("skip"), shards=shard, batch_size=2, num_workers=1)
    assert sorted(_epoch(loader)) == ["jpeg", "png_bad_crc"] and loader.stats()["converted"] == 1
    for seed in (1, 2, 3):  # headers only under raise: whether DALI fails depends on the crop it decodes
        spec = {**_spec("raise"), "seed": seed}
        try:
            delivered = _epoch(feedfast.DataLoader(spec, shards=shard, batch_size=2, num_workers=1))
        except SampleError as exc:  # traced to the file, with libpng's reason
            assert exc.key == "png_bad_crc" and exc.shard == shard and "CRC" in exc.reason, str(exc)
        else:
            assert sorted(delivered) == ["jpeg", "png_bad_crc"]


def test_a_slow_check_is_cut_off_and_reported() -> None:
    import io

    import numpy as np
    from PIL import Image

    big = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (1500, 1500, 3), dtype=np.uint8)).save(
        big, "PNG", compress_level=0)
    pool = CheckPool(1, seconds=0.05)
    try:
        t0 = time.monotonic()
        slow, fine = list(pool.map([("check", big.getvalue(), 10**8, True), ("check", IMAGES["jpeg"][0], 10**8, True)]))
        assert isinstance(slow, Failed) and "longer than 0.05 s" in slow.reason
        assert not isinstance(fine, Failed) or "longer" in fine.reason  # a fresh worker takes the next job
    finally:
        pool.close()
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("bad", ["dds_dxgi93", "gif_truncated", "jpeg_truncated"])
def test_cli_exits_2_with_one_line_naming_shard_and_key(tmp_path: Path, bad: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from feedfast.cli.main import main

    shard = str(write_hostile(tmp_path, ["jpeg", bad, "png16", "bmp"]))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_spec("raise")))
    code = main(["bench", str(spec), "--shards", shard, "--batch-size", "2", "--batches", "2", "--rounds", "1",
                 "--warmup", "0", "--threads", "1", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and shard in err and repr(bad) in err and "internal error" not in err


def test_to_8bit_scales_16_bit_images_instead_of_clipping() -> None:
    import io

    import numpy as np
    from PIL import Image

    from feedfast.sources.decoders import to_8bit

    img = Image.open(io.BytesIO(IMAGES["png16"][0]))
    assert img.mode.startswith("I")
    out = to_8bit(img).convert("RGB")
    mean = np.asarray(out).mean() / 255
    assert abs(mean - 0.5) < 0.01


@pytest.mark.parametrize("backend", ["dali", "pil"])
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_pixels_of_formats_one_decoder_lacks_match_the_source(tmp_path: Path, backend: str, on_error: str) -> None:
    """A deflate TIFF (DALI only, when PIL lacks libtiff), a PSD and a 16-bit PNG arrive with their pixels."""
    import numpy as np

    from tests.corpus import _photo

    keys = ["tiff_deflate", "psd", "tga", "jpeg"]
    shard = str(write_hostile(tmp_path, keys))
    spec = {"pipeline": {"image": ["decode", {"resize": {"size": [48, 64]}}], "label": ["label"]},
            "source": {"components": {"image": {"ext": "jpg", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}},
                       "on_error": on_error}, "batch": {"size": 2}, "outputs": ["image", "label"]}
    loader = feedfast.DataLoader(spec, shards=shard, backend=backend, num_workers=0 if backend == "pil" else None)
    got = _epoch(loader)
    assert sorted(got) == sorted(keys)
    source = np.asarray(_photo(7, 64, 48)).astype(int)
    for key in ("tiff_deflate", "psd", "tga"):  # lossless formats: exact, or within a resize's rounding
        assert np.abs(got[key].numpy().astype(int) - source).max() <= 1, key
    assert np.abs(got["jpeg"].numpy().astype(int) - source).mean() < 12  # lossy (the source is noisy)


def test_a_decoder_crash_is_a_verdict_and_the_pool_runs_on() -> None:
    import io
    import os
    import signal
    import threading

    import numpy as np
    from PIL import Image

    big = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (3000, 3000, 3), dtype=np.uint8)).save(
        big, "PNG", compress_level=0)
    pool = CheckPool(1, seconds=60)
    try:
        list(pool.map([("check", IMAGES["jpeg"][0], 10**8, True)]))  # started and warm
        victim = pool._workers[0].proc.pid
        threading.Timer(0.3, lambda: os.kill(victim, signal.SIGKILL)).start()  # as a segfaulting codec would die
        crashed, after = list(pool.map([("check", big.getvalue(), 10**8, True), ("check", IMAGES["jpeg"][0], 10**8, True)]))
        assert isinstance(crashed, Failed) and "crashed" in crashed.reason
        assert not isinstance(after, Failed) and after.status == "ok"
    finally:
        pool.close()


@pytest.mark.slow
def test_mutated_files_of_every_format_get_a_verdict_quickly() -> None:
    """Truncated, bit-flipped and zeroed copies of every corpus file: a verdict each, none raises, none hangs."""
    import random

    from feedfast.sources.checkworker import pool

    rng = random.Random(14)
    jobs, names = [], []
    for key, (data, _) in IMAGES.items():
        if not data or key == "bomb":
            continue
        for kind in ("truncate", "flip", "zero"):
            b = bytearray(data)
            at = rng.randrange(len(b))
            if kind == "truncate":
                b = b[:at]
            elif kind == "flip":
                for _ in range(8):
                    b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
            else:
                b[at:at + 64] = bytes(len(b[at:at + 64]))
            for decode in (True, False):
                jobs.append(("check", bytes(b), MAX_PIXELS, decode))
                names.append(f"{key}/{kind}/{decode}")
    t0 = time.monotonic()
    answers = list(pool().map(jobs))
    assert len(answers) == len(jobs)
    for name, a in zip(names, answers):
        assert isinstance(a, Failed) or a.status in ("ok", "convert", "bad"), (name, a)
        assert not isinstance(a, Failed) or "longer than" in a.reason or "crashed" in a.reason, (name, a)
    assert time.monotonic() - t0 < 3 * len(jobs) / pool().size + 30


def test_pil_codecs_lists_each_codec() -> None:
    from feedfast.sources.decoders import pil_codecs

    codecs = pil_codecs()
    assert set(codecs) >= {"jpg", "zlib", "libtiff", "webp", "jpg_2000", "littlecms2"}
    assert codecs["jpg"][0] and codecs["zlib"][0] and all(isinstance(p, bool) and w for p, w in codecs.values())


QUIET_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import feedfast
from tests.test_hostile import _spec
for backend in ("dali", "pil"):
    loader = feedfast.DataLoader(_spec("skip"), shards={shard!r}, batch_size=4, num_workers=1, backend=backend,
                                 max_pixels=4_000_000)
    print(backend, sum(len(y) for _, y in loader), len(loader.skipped_samples()))
"""


def test_a_successful_run_over_the_hostile_corpus_prints_nothing_but_its_own_output(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[1])
    shard = str(write_hostile(tmp_path))
    proc = subprocess.run([sys.executable, "-c", QUIET_SCRIPT.format(root=root, shard=shard)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": root})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["dali", str(len(DELIVERED)), str(len(SKIPPED)),
                                   "pil", str(len(DELIVERED)), str(len(SKIPPED))]
    assert proc.stderr == ""  # no DALI [ERROR] lines, no libpng or PIL warnings


def test_dali_check_refuses_too_many_pixels_from_the_header() -> None:
    from feedfast.sources.decoders import DaliDecoder

    dali = DaliDecoder()
    if not dali.available:
        pytest.skip("DALI is not installed")
    data = IMAGES["bomb_tiff_deflate"][0]
    pixels, reason = dali.decode(data, max_pixels=4_000_000)
    assert pixels is None and "9000000 pixels exceeds max_pixels=4000000" in reason
    pixels, reason = dali.decode(IMAGES["jpeg"][0], max_pixels=4_000_000)
    assert reason == "" and pixels.shape == (48, 64, 3)


def test_a_forked_child_neither_uses_nor_kills_the_parents_workers() -> None:
    import os

    from feedfast.sources.checkworker import pool

    parent = pool()
    list(parent.map([("check", IMAGES["jpeg"][0], MAX_PIXELS, True)]))
    pids = [w.proc.pid for w in parent._workers]
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        ok = pool() is not parent
        parent.close()  # as atexit would
        os._exit(0 if ok else 1)
    assert os.waitpid(child, 0)[1] == 0
    assert [w.proc.pid for w in parent._workers] == pids and all(w.proc.poll() is None for w in parent._workers)
    (answer,) = parent.map([("check", IMAGES["jpeg"][0], MAX_PIXELS, True)])
    assert answer.status == "ok"
