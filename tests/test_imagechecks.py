"""Header checks in batches: the verdicts each image gets alone, retries of failed batches, many shards at once."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest

from feedfast.sources import checked, imagechecks
from feedfast.sources.checked import check_members, check_shard, check_shards
from feedfast.sources.checkworker import Failed
from feedfast.sources.decoders import Verdicts
from feedfast.sources.imagechecks import _cuts, _one_by_one, run_checks
from feedfast.sources.index import scan_tar
from feedfast.sources.validate import SNIFF_BYTES, Verdict
from tests.corpus import hostile_images, mutate, write_hostile, write_tar

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
