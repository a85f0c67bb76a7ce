"""s3 reads over feedfast's http client: what S3 refuses, signed again or named (a loopback server; no network).

The signer is a stand-in that hands out URLs of :class:`tests.rangeserver.RangeServer` (whose faults answer
403s); moto's S3 behind real signed URLs is tests/test_s3.py's.
"""

from __future__ import annotations

import io
import urllib.error
from email.message import Message
from pathlib import Path

import pytest

from feedfast.shards.transport import s3http
from feedfast.shards.transport.remote import RemoteError, Transfer
from tests.rangeserver import RangeServer

FAST = Transfer(timeout=5.0, retries=1, backoff=0.01)


class _Signer:
    """Signs ``s3://bucket/a.tar`` as the server's ``/a.tar``; records each ask."""

    def __init__(self, base: str) -> None:
        self.base, self.asked = base, []  # type: ignore[var-annotated]

    def url(self, url: str, *, region: str | None = None, fresh: bool = False) -> str:
        self.asked.append((region, fresh))
        return f"{self.base}/a.tar"


@pytest.fixture
def served(tmp_path: Path) -> tuple[RangeServer, bytes]:
    data = bytes(range(256)) * 64
    (tmp_path / "a.tar").write_bytes(data)
    return RangeServer(tmp_path), data


def test_a_403_is_signed_again_once_then_named_with_what_to_check(served: tuple[RangeServer, bytes]) -> None:
    server, data = served
    with server:
        signer = _Signer(server.url)
        server.faults["/a.tar"] = [403]  # an expired signature: the fresh one is taken
        assert s3http.read_range(signer, "s3://bucket/a.tar", 100, 50, FAST) == data[100:150]  # type: ignore[arg-type]
        assert signer.asked == [(None, False), (None, True)]
        server.faults["/a.tar"] = [403, 403]
        with pytest.raises(RemoteError, match=r"'s3://bucket/a\.tar' at bytes 0-9: HTTP 403.*check the credentials") \
                as err:
            s3http.read_range(signer, "s3://bucket/a.tar", 0, 10, FAST)  # type: ignore[arg-type]
        assert err.value.status == 403 and err.value.url == "s3://bucket/a.tar"
        assert server.url not in str(err.value)  # a signed URL is a bearer token: never in a message
        assert s3http.stream(signer, "s3://bucket/a.tar", lambda f: f.read(), FAST) == data  # type: ignore[arg-type]


def test_an_answer_naming_the_buckets_region_is_signed_for_it() -> None:
    asked: list[tuple[str | None, bool]] = []

    class Signer:
        def url(self, url: str, *, region: str | None = None, fresh: bool = False) -> str:
            asked.append((region, fresh))
            return f"https://s3.invalid/{region}"

    def read(signed: str) -> bytes:
        if signed.endswith("/eu-west-1"):
            return b"bytes"
        headers = Message()
        headers["x-amz-bucket-region"] = "eu-west-1"
        body = b"<Error><Code>AuthorizationHeaderMalformed</Code><Message>the region is wrong</Message></Error>"
        try:
            raise urllib.error.HTTPError(signed, 400, "Bad Request", headers, io.BytesIO(body))
        except urllib.error.HTTPError as exc:
            raise RemoteError("cannot read shard 's3://b/a.tar': HTTP 400 Bad Request", url="s3://b/a.tar",
                              status=400) from exc

    assert s3http._signed(Signer(), "s3://b/a.tar", read) == b"bytes"  # type: ignore[arg-type]
    assert asked == [(None, False), ("eu-west-1", True)]
