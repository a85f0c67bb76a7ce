"""pil_warnings: what a decoding thread warns goes to logging, naming the sample; other threads' warnings are untouched."""

from __future__ import annotations

import logging
import threading
import warnings

import pytest

from feedfast.loader.backends.pil_warnings import routed


def test_a_decoding_threads_warnings_are_logged_and_other_threads_are_left_alone(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kw: shown.append(str(message)))
    decoding, waiting = threading.Event(), threading.Event()

    def decode() -> None:
        with routed(("train-0000.tar", "k1")):
            decoding.set()
            waiting.wait(10)  # the other thread warns while this one is inside the block
            warnings.warn("Corrupt EXIF data (pil_warnings test)", UserWarning, stacklevel=1)

    with caplog.at_level(logging.DEBUG, logger="feedfast.pil"), warnings.catch_warnings():
        warnings.simplefilter("always")
        worker = threading.Thread(target=decode)
        worker.start()
        decoding.wait(10)
        warnings.warn("the training loop's own (pil_warnings test)", UserWarning, stacklevel=1)
        waiting.set()
        worker.join()
    assert shown == ["the training loop's own (pil_warnings test)"]
    (record,) = [r for r in caplog.records if r.name == "feedfast.pil"]
    assert record.levelname == "DEBUG" and "'train-0000.tar'" in record.getMessage() and "'k1'" in record.getMessage()
    assert "UserWarning: Corrupt EXIF data (pil_warnings test)" in record.getMessage()
