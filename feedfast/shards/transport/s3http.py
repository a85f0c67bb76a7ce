"""s3:// byte ranges and whole objects over feedfast's http client, on URLs signed by :mod:`.s3sign`.

A read is :func:`~feedfast.shards.transport.remote.fetch_range` (or :func:`~feedfast.shards.transport.remote.http_stream`)
of the object's signed URL: the same kept-alive connections, deadlines, retries and checks of
short, cut and misplaced answers as http shards, and messages that name the ``s3://`` URL. What S3
refuses is translated here, with S3's own reason (the ``Code`` and ``Message`` of its error):

- 403 (an expired signature, rotated credentials): signed again and tried once more; a second 403
  is a :class:`~feedfast.shards.transport.remote.RemoteError` naming the shard, S3's reason and what to check;
- an answer naming the bucket's region (``x-amz-bucket-region``: a bucket in another region than the
  configured one; S3 answers 301 or 400): signed for that region and tried once more;
- 404 (``NoSuchKey``, ``NoSuchBucket``): ``shard not found``, as fsspec's reads say it.
"""

from __future__ import annotations

import re
import urllib.error
from typing import IO, Callable, TypeVar

from feedfast.shards.transport.remote import RemoteError, Transfer, fetch_range, http_stream
from feedfast.shards.transport.s3sign import Signer

T = TypeVar("T")
_CODE = re.compile(rb"<Code>([^<]{1,200})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{1,500})</Message>")
_CHECK = ("check the credentials botocore finds (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
          "the shared files, a role) and that they may read the object")


def read_range(signer: Signer, url: str, offset: int, size: int, transfer: Transfer) -> bytes:
    """``size`` bytes of ``url`` at ``offset``: one ranged GET of its signed URL (retried as http's are).

    Raises:
        RemoteError: the bytes cannot be read, the object ends before them, or S3 refused; names ``url``.
    """
    return _signed(signer, url, lambda signed: fetch_range(signed, offset, size, transfer, name=url))


def stream(signer: Signer, url: str, consume: Callable[[IO[bytes]], T], transfer: Transfer) -> T:
    """Hand the whole object ``url``, a stream that ends only at its end, to ``consume`` (retried from the start).

    Raises:
        RemoteError: as :func:`read_range`.
    """
    return _signed(signer, url, lambda signed: http_stream(signed, consume, transfer, name=url))


def _signed(signer: Signer, url: str, read: Callable[[str], T]) -> T:
    """``read`` of ``url``'s signed URL, signed again once (for the bucket's region, if S3 named it) when refused."""
    region: str | None = None
    for attempt in range(2):
        try:
            return read(signer.url(url, region=region, fresh=attempt > 0))
        except RemoteError as exc:
            answer = exc.__cause__ if isinstance(exc.__cause__, urllib.error.HTTPError) else None
            named = answer.headers.get("x-amz-bucket-region") if answer is not None and answer.headers else None
            if attempt == 0 and (exc.status == 403 or (named and named != region)):
                region = named or region
                continue
            if answer is None:
                raise  # no answer of S3's to explain it (a dropped connection, a cut body)
            raise _refused(url, exc, answer) from exc
    raise AssertionError("unreachable")


def _refused(url: str, exc: RemoteError, answer: urllib.error.HTTPError) -> RemoteError:
    """``exc`` with S3's reason, and what to do about it."""
    reason = _reason(answer)
    if exc.status == 404:
        return RemoteError(f"shard not found: {url!r}{reason}", url=url, status=404)
    check = f"; {_CHECK}" if exc.status == 403 else ""
    return RemoteError(f"{exc}{reason}{check}", url=url, status=exc.status)


def _reason(answer: urllib.error.HTTPError) -> str:
    """`` (S3: Code: Message)`` from an S3 error's XML body; empty when it has none."""
    try:
        body = answer.read() if answer.fp is not None else b""
    except (OSError, ValueError):
        body = b""
    code, message = _CODE.search(body), _MESSAGE.search(body)
    if code is None:
        return ""
    text = code.group(1).decode("utf-8", "replace")
    if message is not None:
        text += ": " + message.group(1).decode("utf-8", "replace")
    return f" (S3: {text})"
