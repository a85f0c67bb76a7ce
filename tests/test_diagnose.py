"""diagnose: a DALI failure becomes an error naming shard, sample and the decoder's reason."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

import feedfast
from feedfast.errors import FeedfastError, SampleError
from feedfast.loader.backends.dali.diagnose import diagnose, first_line
from tests.corpus import write_hostile
from tests.helpers import SMALL_SPEC

DALI_TEXT = ("Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.decoders.image`,\n"
             "encountered:\n\nFailed to decode sample #1 : {info}\nCurrent pipeline object is no longer valid.")


def _loader(shard: str) -> feedfast.DataLoader:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["source"] = {"components": {"image": {"ext": "jpg", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}},
                      "on_error": "raise"}
    return feedfast.DataLoader(spec, shards=shard, batch_size=2, num_workers=1)


@pytest.fixture()
def shard(tmp_path: Path) -> str:
    return str(write_hostile(tmp_path, ["jpeg", "png_bad_crc", "bmp"]))  # headers fine: the raise check passes


def test_an_unnamed_failure_is_traced_to_the_file_both_decoders_do_not_read(shard: str) -> None:
    loader = _loader(shard)
    err = diagnose(RuntimeError(DALI_TEXT.format(info="")), loader.plan, 0, loader.shards)
    assert isinstance(err, SampleError) and err.shard == shard and err.key == "png_bad_crc"
    assert "CRC" in err.reason and "on_error='skip'" in err.reason


def test_a_named_failure_gets_the_decoders_reason_not_dalis_wrapper(shard: str) -> None:
    loader = _loader(shard)
    info = f"{shard}:1536:png_bad_crc.jpg"
    err = diagnose(RuntimeError(DALI_TEXT.format(info=info)), loader.plan, 0, loader.shards, max_pixels=10**8)
    assert isinstance(err, SampleError) and err.key == "png_bad_crc" and "CRC" in err.reason
    assert "Critical error" not in err.reason


def test_a_failure_no_file_explains_says_so(tmp_path: Path) -> None:
    shard = str(write_hostile(tmp_path, ["jpeg", "bmp"]))
    loader = _loader(shard)
    err = diagnose(RuntimeError("Critical error in pipeline:\nsomething else failed"), loader.plan, 3, loader.shards)
    assert type(err) is FeedfastError and "epoch step 3" in str(err) and "something else failed" in str(err)


def test_first_line_skips_bare_headers() -> None:
    assert first_line(RuntimeError("Critical error in pipeline:\nError in CPU operator x")) == "Error in CPU operator x"


def test_the_unnarrowed_scan_is_bounded(shard: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import feedfast.loader.backends.dali.diagnose as d

    loader = _loader(shard)
    monkeypatch.setattr(d, "SCAN_LIMIT", 1)  # png_bad_crc is the second sample
    assert type(diagnose(RuntimeError(DALI_TEXT.format(info="")), loader.plan, 0, loader.shards)) is FeedfastError


def test_a_failure_no_image_explains_is_named_from_dalis_message(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """As when nvJPEG rejects a file DALI's CPU decoder reads: the rescue finds no image to blame, so the failure is
    raised, naming the sample DALI's message names, with DALI's reason."""
    from feedfast.loader.backends.dali.life import LifePipe

    shard = str(write_hostile(tmp_path, ["jpeg", "ppm", "bmp", "png16"]))

    real, calls = LifePipe.take, []

    def failing(self: LifePipe, segment: int, step: int, **kw: bool) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError(DALI_TEXT.format(info=f"{shard}:4096:bmp.jpg"))
        return real(self, segment, step, **kw)

    monkeypatch.setattr(LifePipe, "take", failing)
    loader = feedfast.DataLoader(_loader(shard).spec, shards=shard, batch_size=2, num_workers=1, backend="dali")
    with pytest.raises(SampleError) as info:
        list(loader)
    assert info.value.shard == shard and info.value.key == "bmp" and "decoders.image" in info.value.reason
