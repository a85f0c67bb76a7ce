"""diagnose: a DALI failure becomes an error naming shard, sample and the decoder's reason, from the epoch's feed."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

import feedfast
from feedfast.errors import FeedfastError, SampleError
from feedfast.loader.backends.dali.diagnose import diagnose, first_line
from feedfast.loader.backends.dali.stream import StreamEpoch, epoch_stream
from feedfast.order.deal import plan_epoch
from tests.corpus import write_hostile
from tests.helpers import SMALL_SPEC

DALI_TEXT = ("Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.decoders.image`,\n"
             "encountered:\n\nFailed to decode sample #{number} : \nCurrent pipeline object is no longer valid.")


def _loader(shard: str) -> feedfast.DataLoader:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["source"] = {"components": {"image": {"ext": "jpg", "kind": "image"}, "label": {"ext": "cls", "kind": "label"}},
                      "on_error": "raise"}
    return feedfast.DataLoader(spec, shards=shard, batch_size=2, num_workers=1)


@contextlib.contextmanager
def _stream(loader: feedfast.DataLoader) -> Iterator[StreamEpoch]:
    """Epoch 0's feed, unshuffled, as the DALI backend hands it to :func:`diagnose`."""
    ep = plan_epoch(list(loader.shards.sizes), batch_size=2, rank=0, world=1, last_batch="partial",
                    partition="shards")
    stream = epoch_stream(loader.plan, loader.shards, ep, rank=0, world=1, batch_size=2, seed=0, epoch=0)
    try:
        yield stream
    finally:
        stream.feeder.close()


@pytest.fixture()
def shard(tmp_path: Path) -> str:
    return str(write_hostile(tmp_path, ["jpeg", "png_bad_crc", "bmp"]))  # headers fine: the raise check passes


def test_an_unnumbered_failure_is_traced_to_the_steps_image_both_decoders_do_not_read(shard: str) -> None:
    loader = _loader(shard)
    with _stream(loader) as stream:
        err = diagnose(RuntimeError("Critical error in pipeline:\nError in CPU operator x failed"), loader.plan, 0,
                       stream)
    assert isinstance(err, SampleError) and err.shard == shard and err.key == "png_bad_crc"
    assert "CRC" in err.reason and "on_error='skip'" in err.reason


def test_a_numbered_failure_gets_the_decoders_reason_not_dalis_wrapper(shard: str) -> None:
    loader = _loader(shard)
    with _stream(loader) as stream:
        err = diagnose(RuntimeError(DALI_TEXT.format(number=1)), loader.plan, 0, stream, max_pixels=10**8)
    assert isinstance(err, SampleError) and err.key == "png_bad_crc" and "CRC" in err.reason
    assert "Critical error" not in err.reason


def test_a_numbered_sample_both_decoders_read_is_named_with_dalis_reason(shard: str) -> None:
    loader = _loader(shard)
    with _stream(loader) as stream:
        err = diagnose(RuntimeError(DALI_TEXT.format(number=0)), loader.plan, 0, stream)
    assert isinstance(err, SampleError) and err.key == "jpeg" and "decoders.image" in err.reason


def test_a_failure_no_file_explains_says_so(tmp_path: Path) -> None:
    shard = str(write_hostile(tmp_path, ["jpeg", "bmp"]))
    loader = _loader(shard)
    with _stream(loader) as stream:
        err = diagnose(RuntimeError("Critical error in pipeline:\nsomething else failed"), loader.plan, 0, stream)
    assert type(err) is FeedfastError and "epoch step 0" in str(err) and "something else failed" in str(err)


def test_first_line_skips_bare_headers() -> None:
    assert first_line(RuntimeError("Critical error in pipeline:\nError in CPU operator x")) == "Error in CPU operator x"


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
            raise RuntimeError(DALI_TEXT.format(number=0))  # step 1: bmp, png16
        return real(self, segment, step, **kw)

    monkeypatch.setattr(LifePipe, "take", failing)
    loader = feedfast.DataLoader(_loader(shard).spec, shards=shard, batch_size=2, num_workers=1, backend="dali",
                                 shuffle=False)
    with pytest.raises(SampleError) as info:
        list(loader)
    assert info.value.shard == shard and info.value.key == "bmp" and "decoders.image" in info.value.reason
