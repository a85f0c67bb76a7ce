"""The second opinion: DALI's CPU decoder on images pillow-simd rejects, in the asked colour, or None."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from feedfast.checks.decoders import DaliDecoder
from feedfast.checks.second_decode import as_ppm, decode_second, rescue_png, second_image, second_opinion
from feedfast.ops.generic import DecodeFailure
from tests.corpus import photo
from tests.jpegcases import decodes_with_pil, jpeg, lossless_jpeg, pillow_rejects_dali_decodes


@pytest.fixture(scope="module")
def dali() -> DaliDecoder:
    return DaliDecoder()


def test_dali_pixels_of_what_pillow_rejects_in_the_asked_colour(dali: DaliDecoder) -> None:
    for data in pillow_rejects_dali_decodes(3):
        assert not decodes_with_pil(data)
        rgb, gray = decode_second(data, color="rgb"), decode_second(data, color="gray")
        assert rgb is not None and gray is not None
        assert rgb.shape == (48, 64, 3) and gray.shape == (48, 64, 1) and rgb.dtype == gray.dtype == np.uint8
        assert np.array_equal(rgb, dali.decode(data)[0])  # what the DALI backend decodes


def test_a_jpeg_dali_reads_only_as_grey_is_converted_as_pillow_converts() -> None:
    grey = np.asarray(photo(3, 40, 24).convert("L"))
    data = lossless_jpeg(grey)
    assert not decodes_with_pil(data)
    assert np.array_equal(decode_second(data, color="gray")[:, :, 0], grey)  # lossless: exactly
    rgb = decode_second(data, color="rgb")
    assert rgb is not None and rgb.shape == (24, 40, 3) and all(np.array_equal(rgb[:, :, c], grey) for c in range(3))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(rescue_png(data)))), grey)


def test_what_neither_decodes_is_none_with_dalis_reason() -> None:
    for data in (jpeg(0)[:300], b"<html>404</html>"):
        pixels, reason = second_opinion(data)
        assert pixels is None and reason.startswith("DALI"), reason
    assert second_opinion(b"") == (None, "the component is empty")
    with pytest.raises(ValueError, match="color"):
        second_opinion(jpeg(0), color="cmyk")
    with pytest.raises(ValueError, match="cannot re-encode"):
        rescue_png(b"<html>404</html>")


def test_second_image_is_a_loaded_pil_image_or_a_decode_failure() -> None:
    data = pillow_rejects_dali_decodes(1)[0]
    img = second_image(data, color="rgb", failed="OSError: broken data stream")
    assert (img.mode, img.size) == ("RGB", (64, 48))
    assert second_image(data, color="gray", failed="x").mode == "L"
    with pytest.raises(DecodeFailure, match=r"cannot decode the image \(OSError: broken data stream; DALI"):
        second_image(jpeg(0)[:300], color="rgb", failed="OSError: broken data stream")


def test_a_decode_past_its_time_limit_is_stopped() -> None:
    from tests.jpegcases import scan_bomb

    pixels, reason = second_opinion(scan_bomb(2048, 6000), seconds=0.2)  # seconds of decoding, stopped at 0.2 s
    assert pixels is None and "longer than 0.2 s" in reason


def test_ppm_is_lossless() -> None:
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(as_ppm(rgb)))), rgb)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(as_ppm(rgb[:, :, :1]))))[:, :, None], rgb[:, :, :1])
