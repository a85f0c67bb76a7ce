"""A crawl's worth of hostile files: every sample is delivered or accounted for, under both policies and backends."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import feedfast
from feedfast.checks.worker import CheckPool, Failed
from feedfast.errors import FeedfastError, SampleError
from tests.corpus import hostile_images, mutate, noisy_png, write_hostile
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


@pytest.mark.parametrize("backend", ["dali", "pil", "threads"])
def test_raise_delivers_every_good_file(tmp_path: Path, backend: str) -> None:
    """Under raise only headers are checked; files whose pixels DALI's decoder rejects (png_bad_crc,
    jpeg_junk_segment) are rescued mid-epoch on the dali backend and decoded by PIL on the others."""
    shard = str(write_hostile(tmp_path, DELIVERED))
    loader = feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=4, num_workers=1, backend=backend)
    assert sorted(_epoch(loader)) == DELIVERED
    assert loader.stats()["delivered"] == len(DELIVERED)


@pytest.mark.parametrize("bad", ["zero", "garbage", "jpeg_truncated", "png_truncated", "gif_truncated",
                                 "tga_truncated", "sgi_truncated", "dds_dxgi93", "junk_before_soi"])
def test_raise_names_shard_key_and_reason(tmp_path: Path, bad: str) -> None:
    shard = str(write_hostile(tmp_path, ["jpeg", bad, "png16"]))
    with pytest.raises(SampleError) as info:
        loader = feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=4, num_workers=1)
        _epoch(loader)
    assert info.value.shard == shard and info.value.key == bad and info.value.reason
    assert "Critical error" not in info.value.reason  # the decoder's own reason, not DALI's wrapper


def test_after_an_error_mid_epoch_the_next_loader_checks_as_usual(tmp_path: Path) -> None:
    """DALI fails the truncated JPEG mid-epoch and PIL cannot decode it either: a SampleError naming it. The check pool
    that found it is free again at once, while the error (and its traceback) is still held."""
    import threading

    shard = str(write_hostile(tmp_path, ["jpeg", "jpeg_truncated"]))
    with pytest.raises(SampleError) as info:
        _epoch(feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=2, num_workers=1, backend="dali"))
    assert info.value.key == "jpeg_truncated" and "truncated" in info.value.reason
    good = str(write_hostile(tmp_path / "good", ["jpeg", "png16"]))
    done: list[list[str]] = []
    worker = threading.Thread(daemon=True, target=lambda: done.append(sorted(_epoch(feedfast.DataLoader(
        _spec("skip"), shards=good, batch_size=2, num_workers=1, backend="dali")))))
    worker.start()
    worker.join(120)
    assert done == [["jpeg", "png16"]], "the check pool stayed locked after the error"


def test_raise_under_the_pil_backend_names_shard_and_key(tmp_path: Path) -> None:
    shard = str(write_hostile(tmp_path, ["jpeg", "jpeg_truncated", "png16"]))
    with pytest.raises(FeedfastError) as info:
        _epoch(feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=4, num_workers=0, backend="pil"))
    assert shard in str(info.value) and "jpeg_truncated" in str(info.value)


def _batches(loader: feedfast.DataLoader) -> list[tuple[list[str], torch.Tensor]]:
    return [([k for _, k in loader.last_origins[: loader.last_valid]], x[: loader.last_valid].clone())
            for x, _ in loader]


RESCUE_KEYS = ["jpeg", "bmp", "png_bad_crc", "ppm", "jpeg_gray", "jpeg_junk_segment", "png16", "tiff"]


def test_dali_rescues_files_its_decoder_rejects_in_place_and_a_state_resumes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Headers are fine, so the raise check passes them; DALI's decoder then fails steps 1 and 2. Each failure is traced
    to its file, which PIL decodes and DALI is fed as PNG: the epoch keeps its order and counts, and a state taken
    before the first failure (DALI's checkpoint) or after it (the rescue's) resumes to the same batches, pixels included."""
    import json

    shard = str(write_hostile(tmp_path, RESCUE_KEYS))

    def make() -> feedfast.DataLoader:
        return feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=2, num_workers=1, backend="dali")

    with caplog.at_level("INFO", logger="feedfast.dali"):
        loader = make()
        full = _batches(loader)
    assert [k for keys, _ in full for k in keys] == RESCUE_KEYS and loader.stats()["delivered"] == len(RESCUE_KEYS)
    rescued = [r.getMessage() for r in caplog.records if "re-encoded as PNG" in r.getMessage()]
    assert len(rescued) == 2 and "png_bad_crc" in rescued[0] and "CRC error" in rescued[0], rescued
    assert "jpeg_junk_segment" in rescued[1] and "Invalid marker" in rescued[1], rescued
    assert [(r["shard"], r["key"]) for r in loader.rescued_samples()] == [(shard, "png_bad_crc"),
                                                                          (shard, "jpeg_junk_segment")]
    assert loader.stats()["converted"] == 2 and loader.stats()["skipped"] == 0  # delivered, counted as re-encoded
    for taken in (1, 2):
        first = make()
        batches = iter(first)
        for _ in range(taken):
            next(batches)
        state = json.loads(json.dumps(first.state_dict()))
        first.close()
        resumed = make()
        resumed.load_state_dict(state)
        rest = _batches(resumed)
        assert [keys for keys, _ in rest] == [keys for keys, _ in full[taken:]], taken
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rest, full[taken:])), taken


def test_a_rescue_drops_the_failed_pipeline_and_stops_its_feeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rescue builds a pipeline at the failed step in place of the failed one, which is dropped with every feed it
    had queued (their reads stop): each pipeline but the live one is closed by the epoch's end, that one at the
    loader's close."""
    import feedfast.loader.backends.dali.backend as dali_backend
    from feedfast.loader.backends.dali.life import StepQueue

    closed: list[StepQueue] = []
    built: list[StepQueue] = []
    real_close, real_make = StepQueue.close, dali_backend.make_life

    def close(self: StepQueue) -> None:
        closed.append(self)
        real_close(self)

    def make_life(plan: Any, queue: StepQueue, **kw: Any) -> Any:
        built.append(queue)
        return real_make(plan, queue, **kw)

    monkeypatch.setattr(StepQueue, "close", close)
    monkeypatch.setattr(dali_backend, "make_life", make_life)
    shard = str(write_hostile(tmp_path, RESCUE_KEYS))
    loader = feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=2, num_workers=1, backend="dali")
    assert list(_epoch(loader)) == RESCUE_KEYS
    assert len(built) >= 2 and closed == built[:-1] and all(not queue.segments for queue in closed)
    loader.close()
    assert closed == built


def test_a_shuffled_dali_epoch_rescues_them_too(tmp_path: Path) -> None:
    """shuffle=True reads the global order through the stream transport: the rescue patches the feed itself."""
    shard = str(write_hostile(tmp_path, RESCUE_KEYS))
    loader = feedfast.DataLoader(_spec("raise"), shards=shard, batch_size=2, num_workers=1, backend="dali", shuffle=True)
    assert sorted(_epoch(loader)) == sorted(RESCUE_KEYS)


def test_check_seconds_is_a_spec_setting() -> None:
    """source.check_seconds sets the time limit of the checks (the construction's and the rescue's)."""
    spec = feedfast.load_spec({**_spec("skip"), "source": {**_spec("skip")["source"], "check_seconds": 0.5}})
    assert spec.check_seconds == 0.5 and spec.to_dict()["source"]["check_seconds"] == 0.5
    assert feedfast.load_spec(_spec("skip")).check_seconds == 2.0  # the default: "a second or two"
    for bad in (0, -1, "2", True, 10_000):
        with pytest.raises(feedfast.SpecError, match="check_seconds"):
            feedfast.load_spec({**_spec("skip"), "source": {**_spec("skip")["source"], "check_seconds": bad}})


def test_a_check_over_the_spec_limit_leaves_the_file_out_under_skip(tmp_path: Path) -> None:
    """A 4000x4000 uncompressed PNG takes longer than 0.3 s to check (over a second here; a 64x48 JPEG, 5 ms): under skip it
    is left out and reported as such, and the epoch goes on."""
    from tests.corpus import noisy_png, write_tar

    images = hostile_images()
    shard = str(write_tar(tmp_path / "slow-0000.tar", [("jpeg.jpg", images["jpeg"][0]), ("jpeg.cls", b"0"),
                                                       ("slow.jpg", noisy_png(4000, 2)), ("slow.cls", b"1")]))
    spec = _spec("skip")
    spec["source"]["check_seconds"] = 0.3
    t0 = time.monotonic()
    loader = feedfast.DataLoader(spec, shards=shard, batch_size=2, num_workers=1, max_pixels=10**8)
    assert sorted(_epoch(loader)) == ["jpeg"] and time.monotonic() - t0 < 30
    (report,) = loader.skipped_samples()
    assert report["key"] == "slow" and "longer than 0.3 s" in report["reason"]


def test_a_slow_check_is_cut_off_and_reported() -> None:
    pool = CheckPool(1, seconds=0.05)
    try:
        t0 = time.monotonic()
        slow, fine = list(pool.map([("check", noisy_png(4000, 0), 10**8, True), ("check", IMAGES["jpeg"][0], 10**8, True)]))
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

    from feedfast.checks.decoders import to_8bit

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

    from tests.corpus import photo

    keys = ["tiff_deflate", "psd", "tga", "jpeg"]
    shard = str(write_hostile(tmp_path, keys))
    spec = {"pipeline": {"image": ["decode", {"resize": {"size": [48, 64]}}], "label": ["label"]},
            "source": {"components": {"image": {"ext": "jpg", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}},
                       "on_error": on_error}, "batch": {"size": 2}, "outputs": ["image", "label"]}
    loader = feedfast.DataLoader(spec, shards=shard, backend=backend, num_workers=0 if backend == "pil" else None)
    got = _epoch(loader)
    assert sorted(got) == sorted(keys)
    source = np.asarray(photo(7, 64, 48)).astype(int)
    for key in ("tiff_deflate", "psd", "tga"):  # lossless formats: exact, or within a resize's rounding
        assert np.abs(got[key].numpy().astype(int) - source).max() <= 1, key
    assert np.abs(got["jpeg"].numpy().astype(int) - source).mean() < 12  # lossy (the source is noisy)



@pytest.mark.parametrize(("extra", "deflate", "grey", "rows"), [(1, True, True, None), (1, False, True, 5),
                                                               (1, True, False, 7), (1, False, False, None),
                                                               (2, True, False, None), (2, False, True, 4)])
def test_a_tiff_of_separate_planes_and_unspecified_extra_samples_opens_without_them(
        extra: int, deflate: bool, grey: bool, rows: int | None) -> None:
    """Pillow 12.2 reads such a TIFF (its test image ``separate_planar_extra_samples.tiff``: grey, signed, Deflate, one
    extra); pillow-simd 12.1 refuses it (grey: "cannot identify"; RGB: opened as RGBX, then "unknown raw mode" or "decoder
    error -2"). :func:`open_image` reads it on either, its pixels the kept planes', and PIL's re-encoding is of them."""
    import io

    import numpy as np
    from PIL import Image

    from feedfast.checks.decoders import open_image, pil_png
    from tests.corpus import planar_extra_tiff

    bands = 1 if grey else 3
    planes = np.random.default_rng(extra).integers(0, 256, (30, 20, bands + extra), dtype=np.uint8)
    data = planar_extra_tiff(planes, extra, deflate=deflate, signed=grey, rows_per_strip=rows)
    img = open_image(data)
    assert (img.format, img.mode, img.size) == ("TIFF", "L" if grey else "RGB", (20, 30))
    want = planes[..., 0] if grey else planes[..., :3]
    assert np.array_equal(np.asarray(img), want)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(pil_png(data)))), want)


@pytest.mark.parametrize("backend", ["dali", "pil", "threads"])
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_tiffs_of_separate_planes_and_extra_samples_arrive_with_their_pixels(tmp_path: Path, backend: str,
                                                                             on_error: str) -> None:
    """Issue 37 item 4: skipped before ("not an image file PIL knows"; DALI: "Unsupported sample format: 2"). The signed
    grey one DALI's decoder rejects is re-encoded (skip) or rescued mid-epoch (raise) on the dali backend."""
    import numpy as np

    from tests.corpus import photo

    keys = ["jpeg", "tiff_planar_extra", "tiff_planar_rgbx"]
    spec = {"pipeline": {"image": ["decode", {"resize": {"size": [48, 64]}}], "label": ["label"]},
            "source": {"components": {"image": {"ext": "jpg", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}},
                       "on_error": on_error}, "batch": {"size": 2}, "outputs": ["image", "label"]}
    loader = feedfast.DataLoader(spec, shards=str(write_hostile(tmp_path, keys)), backend=backend,
                                 num_workers=0 if backend == "pil" else 1)
    got = _epoch(loader)
    assert sorted(got) == keys and loader.skipped_samples() == []
    source = photo(7, 64, 48)
    grey = np.repeat(np.asarray(source.convert("L"))[..., None], 3, 2)
    for key, want in (("tiff_planar_rgbx", np.asarray(source)), ("tiff_planar_extra", grey)):  # within a resize's rounding
        assert np.abs(got[key].numpy().astype(int) - want.astype(int)).max() <= 1, key


def _kill_once_busy(worker: Any) -> None:
    """SIGKILL ``worker``'s process once its job is wholly sent and it has spent 50 ms of CPU on it: mid-check
    however loaded the machine is (a fixed delay could fire before the job reached the worker, or after it had
    answered; a kill while the pool still writes the job is a worker that died idle, and the job goes to the next)."""
    import os
    import signal

    import psutil

    deadline = time.monotonic() + 60
    while worker.job is None and time.monotonic() < deadline:
        time.sleep(0.001)
    proc = psutil.Process(worker.proc.pid)
    start = sum(proc.cpu_times()[:2])
    while sum(proc.cpu_times()[:2]) - start < 0.05 and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(worker.proc.pid, signal.SIGKILL)


def test_a_decoder_crash_is_a_verdict_and_the_pool_runs_on() -> None:
    import threading

    big = noisy_png(3000, 1)  # about 0.3 s of CPU to check, 0.25 s of it after the job is sent
    pool = CheckPool(1, seconds=60)
    try:
        list(pool.map([("check", IMAGES["jpeg"][0], 10**8, True)]))  # started and warm
        victim = pool._workers[0]
        threading.Thread(target=_kill_once_busy, args=(victim,), daemon=True).start()  # as a segfaulting codec dies
        crashed, after = list(pool.map([("check", big, 10**8, True), ("check", IMAGES["jpeg"][0], 10**8, True)]))
        assert isinstance(crashed, Failed) and "crashed" in crashed.reason
        assert not isinstance(after, Failed) and after.status == "ok"
    finally:
        pool.close()


@pytest.mark.slow
def test_mutated_files_of_every_format_get_a_verdict_quickly() -> None:
    """Truncated, bit-flipped and zeroed copies of every corpus file: a verdict each, none raises, none hangs."""
    import random

    from feedfast.checks.worker import pool

    rng = random.Random(14)
    jobs, names = [], []
    for key, (data, _) in IMAGES.items():
        if not data or key == "bomb":
            continue
        for kind in ("truncate", "flip", "zero"):
            fuzzed = mutate(data, kind, rng)
            for decode in (True, False):
                jobs.append(("check", fuzzed, MAX_PIXELS, decode))
                names.append(f"{key}/{kind}/{decode}")
    t0 = time.monotonic()
    answers = list(pool().map(jobs))
    assert len(answers) == len(jobs)
    for name, a in zip(names, answers):
        assert isinstance(a, Failed) or a.status in ("ok", "convert", "bad"), (name, a)
        assert not isinstance(a, Failed) or "longer than" in a.reason or "crashed" in a.reason, (name, a)
    assert time.monotonic() - t0 < 3 * len(jobs) / pool().size + 30


def test_pil_codecs_lists_each_codec() -> None:
    from feedfast.checks.decoders import pil_codecs

    codecs = pil_codecs()
    assert set(codecs) >= {"jpg", "zlib", "libtiff", "webp", "jpg_2000", "littlecms2"}
    assert codecs["jpg"][0] and codecs["zlib"][0] and all(isinstance(p, bool) and w for p, w in codecs.values())


QUIET_SCRIPT = """
import json, logging, sys
sys.path.insert(0, {root!r})
import feedfast
from tests.test_hostile import _spec
said = []
class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("feedfast").addHandler(Keep())
logging.getLogger("feedfast").setLevel(logging.DEBUG)
for policy, shard, backends in (("skip", {everything!r}, ("dali", "threads")), ("raise", {good!r}, ("dali", "threads"))):
    for backend in backends:
        loader = feedfast.DataLoader(_spec(policy), shards=shard, batch_size=4, num_workers=1, backend=backend,
                                     max_pixels=4_000_000)
        print(policy, backend, sum(len(y) for _, y in loader), len(loader.skipped_samples()))
        loader.close()
print(json.dumps(said))
"""


def test_a_successful_run_over_the_hostile_corpus_prints_nothing_but_its_own_output(tmp_path: Path) -> None:
    """Under both policies, on the dali and threads backends: DALI's native lines (a TIFF libtiff rejects before OpenCV
    decodes it, libpng's CRC error of a rescued PNG) and PIL's warnings (corrupt EXIF) go to logging, not stderr."""
    import json
    import os
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[1])
    everything, good = str(write_hostile(tmp_path / "all")), str(write_hostile(tmp_path / "good", DELIVERED))
    proc = subprocess.run([sys.executable, "-c", QUIET_SCRIPT.format(root=root, everything=everything, good=good)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": root})
    assert proc.returncode == 0, proc.stderr[-2000:]
    *counts, said = proc.stdout.splitlines()
    assert [line.split() for line in counts] == [
        ["skip", "dali", str(len(DELIVERED)), str(len(SKIPPED))], ["skip", "threads", str(len(DELIVERED)), str(len(SKIPPED))],
        ["raise", "dali", str(len(DELIVERED)), "0"], ["raise", "threads", str(len(DELIVERED)), "0"]]
    assert proc.stderr == ""  # no DALI [ERROR] lines, no libpng or PIL warnings
    logged = "\n".join(json.loads(said))
    assert "[libtiff_decoder]" in logged and "libpng error: IDAT: CRC error" in logged  # DALI's, under raise
    from feedfast.loader.backends.cpu import (
        native,  # PIL's, on the threads backend, where Pillow reads the JPEG's markers; feedfast's extension reads the header in C
    )
    # and never parses that EXIF, so there is no warning to route
    assert ("Corrupt EXIF data" in logged) != native.built()


def test_dali_check_refuses_too_many_pixels_from_the_header() -> None:
    from feedfast.checks.decoders import DaliDecoder

    dali = DaliDecoder()
    if not dali.available:
        pytest.skip("DALI is not installed")
    data = IMAGES["bomb_tiff_deflate"][0]
    pixels, reason = dali.decode(data, max_pixels=4_000_000)
    assert pixels is None and "9000000 pixels exceeds max_pixels=4000000" in reason
    pixels, reason = dali.decode(IMAGES["jpeg"][0], max_pixels=4_000_000)
    assert reason == "" and pixels.shape == (48, 64, 3)


def test_a_worker_that_died_while_idle_is_replaced() -> None:
    """A worker killed between jobs (the OOM killer, say): the next job's send fails, and a fresh worker takes it."""
    import os
    import signal

    pool = CheckPool(1, seconds=60)
    try:
        list(pool.map([("check", IMAGES["jpeg"][0], 10**8, True)]))
        victim = pool._workers[0].proc
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        (answer,) = pool.map([("check", IMAGES["jpeg"][0], 10**8, True)])
        assert not isinstance(answer, Failed) and answer.status == "ok"
    finally:
        pool.close()


def test_a_forked_child_neither_uses_nor_kills_the_parents_workers() -> None:
    import os

    from feedfast.checks.worker import pool

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
