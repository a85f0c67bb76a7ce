"""Header checks in batches: the verdicts each image gets alone, retries of failed batches, many shards at once."""

from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest
from PIL import Image

import feedfast
from feedfast.checks import checked
from feedfast.checks import images as imagechecks
from feedfast.checks.checked import check_members, check_shard, check_shards
from feedfast.checks.decoders import PLAIN_SCANS, Verdicts, check_image, jpeg_scans
from feedfast.checks.images import _cuts, _one_by_one, run_checks
from feedfast.checks.validate import SNIFF_BYTES, Verdict, to_png
from feedfast.checks.worker import CheckPool, Failed
from feedfast.errors import SampleError
from feedfast.shards.index.tarindex import scan_tar
from tests.corpus import hostile_images, mutate, write_hostile, write_tar
from tests.helpers import SMALL_SPEC
from tests.jpegcases import fuzz_members, jpeg, scan_bomb

MAX_PIXELS = 4_000_000


def fuzzed_shard(folder: Path, seed: int) -> str:
    """Every hostile image and a truncated, a flipped and a zeroed copy of each, as ``<key>.jpg`` samples."""
    rng = random.Random(seed)
    members = []
    for key, (data, _) in hostile_images().items():
        copies = [data] + ([mutate(data, kind, rng) for kind in ("truncate", "flip", "zero")] if data else [])
        for i, copy in enumerate(copies):
            members += [(f"{key}-{i}.jpg", copy), (f"{key}-{i}.cls", b"1")]
    noise = rng.randbytes(SNIFF_BYTES + 5000)  # longer than a header check reads: DALI must see it whole
    members += [("noise.jpg", noise), ("noise.cls", b"1")]
    return str(write_tar(folder / f"fuzzed-{seed}.tar", members))


def images_of(path: str) -> list[tuple[str, int, int, str]]:
    return [(s.key, m.offset, m.size, m.name) for s in scan_tar(path) for m in s.members if m.ext == "jpg"]


@pytest.mark.parametrize("batch", [3, imagechecks.BATCH_IMAGES], ids=["batches-of-3", "default"])
def test_batched_verdicts_are_the_ones_each_image_gets_alone(tmp_path: Path, batch: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imagechecks, "BATCH_IMAGES", batch)
    shards = [(p, images_of(p)) for p in (fuzzed_shard(tmp_path, 0), fuzzed_shard(tmp_path, 1))]
    alone = _one_by_one(shards, MAX_PIXELS, False, None)
    assert run_checks(shards, MAX_PIXELS, False, None) == alone
    statuses = {v.status for verdicts in alone for v in verdicts}
    assert {"ok", "bad", "convert", "more"} <= statuses  # the corpus asks every kind of question


class ScriptedPool:
    """A stand-in for the check pool: batches holding a marked image fail or print; single checks say 'alone'."""

    seconds = 2.0

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, ...]] = []

    def map(self, jobs: Iterable[tuple[Any, ...]], *, labels: Iterable[str] | None = None,
            seconds: float | None = None) -> Iterator[Any]:
        for job in jobs:
            self.jobs.append(job)
            if job[0] == "check":
                yield Verdict("ok", f"alone {job[1]!r}")
            elif b"timeout" in job[1]:
                yield Failed("checking took longer than 2 s (a hostile or huge file)")
            elif b"crash" in job[1]:
                yield Failed("the decoder crashed (exit status -11)")
            else:
                yield Verdicts(tuple(Verdict("ok", f"batch {d!r}") for d in job[1]), noisy=b"noisy" in job[1])


def test_failed_and_noisy_batches_are_asked_again_image_by_image(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["a", "b", "timeout", "c", "d", "e", "crash", "f", "noisy", "g"]
    shard = str(write_tar(tmp_path / "s.tar", [(f"{n}.jpg", n.encode()) for n in names]))
    where = images_of(shard)
    fake = ScriptedPool()
    monkeypatch.setattr(imagechecks, "pool", lambda: fake)
    monkeypatch.setattr(imagechecks, "BATCH_IMAGES", 2)
    (verdicts,) = run_checks([(shard, where)], MAX_PIXELS, False, None)
    how = [v.reason.split(" ")[0] for v in verdicts]
    # batches: (a b) (timeout c) (d e) (crash f) (noisy g): the second, fourth and fifth are asked again
    assert how == ["batch", "batch", "alone", "alone", "batch", "batch", "alone", "alone", "alone", "alone"]
    assert [v.reason.split(" ")[1] for v in verdicts] == [repr(n.encode()) for n in names]
    assert [j[0] for j in fake.jobs].count("checks") == 5 and [j[0] for j in fake.jobs].count("check") == 6


def test_batches_hold_at_most_so_many_images_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imagechecks, "BATCH_BYTES", 3 * SNIFF_BYTES)
    where = [("k", 0, size, "n") for size in [10] * 600 + [10 * SNIFF_BYTES] * 7 + [5]]
    cuts = list(_cuts(where))
    assert cuts == [(0, 256), (256, 512), (512, 602), (602, 605), (605, 608)]  # at most three 64 KiB sniffs a batch
    assert list(_cuts([])) == []
    assert list(_cuts([("k", 0, 100 * SNIFF_BYTES, "n")] * 4)) == [(0, 3), (3, 4)]  # what is sent: 64 KiB each


def test_check_shards_is_check_shard_of_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checked, "SHARDS_AT_ONCE", 2)
    paths = [str(write_hostile(tmp_path / "data", name=f"hostile-{i:04d}.tar")) for i in range(3)]
    paths.append(fuzzed_shard(tmp_path / "data", 2))
    shards = [(p, scan_tar(p)) for p in paths]
    exts = [{"jpg"}]
    together = list(check_shards(shards, exts, max_pixels=MAX_PIXELS, cache=tmp_path / "a", decode=False))
    alone = [check_shard(p, s, exts, max_pixels=MAX_PIXELS, cache=tmp_path / "b", decode=False) for p, s in shards]
    assert [(c.kept, c.bad, c.converted) for c in together] == [(c.kept, c.bad, c.converted) for c in alone]
    assert any(c.bad for c in together) and any(c.converted for c in together)
    def cached_only(shards: Iterable[tuple[str, list[Any]]], *_: object) -> list[list[Verdict]]:
        found = [where for _, where in shards]
        assert not any(found), "checked again, not read from the cache"
        return [[] for _ in found]

    monkeypatch.setattr(checked, "run_checks", cached_only)
    again = check_shards(shards, exts, max_pixels=MAX_PIXELS, cache=tmp_path / "a", decode=False)
    assert [c.bad for c in again] == [c.bad for c in together]


def test_check_shards_takes_shards_as_the_workers_need_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generator's next shard is made while the workers check the ones before: at most SHARDS_AT_ONCE ahead."""
    monkeypatch.setattr(checked, "SHARDS_AT_ONCE", 2)
    paths = [str(write_hostile(tmp_path, name=f"h-{i}.tar")) for i in range(5)]
    pulled: list[int] = []

    def opened() -> Iterator[tuple[str, list[Any]]]:
        for i, p in enumerate(paths):
            pulled.append(i)
            yield p, scan_tar(p)

    seen = []
    for n, check in enumerate(check_shards(opened(), [{"jpg"}], max_pixels=MAX_PIXELS, cache=tmp_path / "c",
                                           decode=False)):
        seen.append((n, len(pulled)))
        assert check.kept
    assert seen == [(0, 2), (1, 2), (2, 4), (3, 4), (4, 5)]


def test_check_members_of_a_shard_without_images_starts_no_worker(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    shard = str(write_tar(tmp_path / "labels.tar", [("a.cls", b"1"), ("b.cls", b"2")]))
    monkeypatch.setattr(imagechecks, "pool", lambda: pytest.fail("a pool for no images"))
    assert list(check_members(shard, scan_tar(shard), [{"jpg"}], MAX_PIXELS, False)) == []


# --- what DALI decodes is not called broken (issue 24, item 4) -------------------------------------

def test_skip_checks_convert_what_only_dali_decodes_and_leave_out_what_neither_does(tmp_path: Path) -> None:
    path = str(write_tar(tmp_path / "fuzz-0000.tar", fuzz_members(broken=True)))
    verdicts = {key: v for key, _, v in check_members(path, scan_tar(path), [{"jpg"}], MAX_PIXELS, True)}
    for key, v in verdicts.items():
        kind = key.split("-")[0]
        expected = {"good": "ok", "dali": "convert", "lossless": "convert", "pil": "convert", "cut": "bad"}[kind]
        assert v.status == expected, (key, v)
        if kind in ("dali", "lossless"):
            assert v.reason.startswith("decoded by DALI only (PIL: OSError: broken data stream"), v.reason
    png = to_png(dict(fuzz_members(broken=False))["lossless.jpg"])  # the side shard's image: DALI's grey pixels
    assert Image.open(io.BytesIO(png)).mode == "L"


# --- time bounds that hold (issue 24, item 5) -----------------------------------------------------

def test_a_header_check_counts_a_progressive_jpegs_scans_over_the_whole_file() -> None:
    progressive, bomb = jpeg(0, 640, 480, progressive=True), scan_bomb(1024, 6000)
    assert len(bomb) > SNIFF_BYTES and jpeg_scans(bomb) == (True, 6001) and jpeg_scans(jpeg(0)) == (False, 1)
    sniffed = [check_image(data[:SNIFF_BYTES], max_pixels=MAX_PIXELS, decode=False, dali=None, complete=False)
               for data in (progressive + bytes(SNIFF_BYTES), bomb)]
    assert [v.status for v in sniffed] == ["whole", "whole"]
    assert check_image(progressive, max_pixels=MAX_PIXELS, decode=False, dali=None).status == "ok"
    cut = scan_bomb(256, 2 * PLAIN_SCANS)[:-40]  # many scans, cut short: only a decode sees it
    assert check_image(cut, max_pixels=MAX_PIXELS, decode=False, dali=None).status == "bad"


def test_a_scan_bomb_is_stopped_under_raise_before_any_loader_decodes_it(tmp_path: Path) -> None:
    bomb = scan_bomb(2048, 6000)  # 110 kB: about 3 s of PIL decode on this kind of machine (a minute at 67 MP)
    path = str(write_tar(tmp_path / "bomb-0000.tar", [("a.jpg", jpeg(0)), ("a.cls", b"0"), ("bomb.jpg", bomb),
                                                     ("bomb.cls", b"1"), ("b.jpg", jpeg(1)), ("b.cls", b"2")]))
    spec = {**SMALL_SPEC, "source": {"on_error": "raise", "check_seconds": 0.3}}
    start = time.monotonic()
    with pytest.raises(SampleError, match="longer than 0.3 s") as info:
        feedfast.DataLoader(spec, shards=path, backend="pil", num_workers=0)
    assert info.value.key == "bomb" and time.monotonic() - start < 15
    spec["source"]["on_error"] = "skip"
    loader = feedfast.DataLoader(spec, shards=path, backend="pil", num_workers=0, batch_size=2)
    assert [s["key"] for s in loader.skipped_samples()] == ["bomb"]


def _stopped_for(pool: CheckPool, seconds: float, job: tuple[Any, ...]) -> Any:
    """The answer to ``job`` while its worker is stopped (SIGSTOP) for ``seconds`` of wall time: a machine so
    busy that the check gets no core."""
    list(pool.map([job]))  # the worker started and warm
    pid = pool._workers[0].proc.pid
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
    timer.start()
    try:
        (answer,) = pool.map([job])
    finally:
        timer.cancel()
        with contextlib.suppress(ProcessLookupError):  # killed for running over
            os.kill(pid, signal.SIGCONT)
    return answer


def test_a_check_that_waits_for_a_core_is_not_failed() -> None:
    pool = CheckPool(1, seconds=0.3)
    try:
        assert _stopped_for(pool, 1.2, ("check", jpeg(0), MAX_PIXELS, True)) == Verdict("ok")  # 4 x the limit
    finally:
        pool.close()


def test_a_check_that_makes_no_progress_fails_after_its_wall_bound() -> None:
    pool = CheckPool(1, seconds=0.05)  # wall bound: WALL_FACTOR x 0.05 s = 1 s
    try:
        answer = _stopped_for(pool, 1.5, ("check", jpeg(0), MAX_PIXELS, True))
    finally:
        pool.close()
    assert isinstance(answer, Failed) and "longer than 0.05 s" in answer.reason
