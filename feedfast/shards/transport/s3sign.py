"""Presigned GET URLs of s3:// objects, signed here by botocore, so that s3's bytes come through feedfast's http client.

fsspec's ``cat_file`` (s3fs, aiobotocore) cost the reading process 3.8 ms of CPU a 1.4 MB ranged
GET on 127.0.0.1 (signing, aiohttp's reads, the hop to fsspec's event-loop thread); the same GET by
:func:`~feedfast.shards.transport.remote.fetch_range` on a URL signed beforehand cost 1.0 ms (the shards of
``benchmarks/remote.py`` in moto's server; docs/benchmarks-history.md, 2026-12-02). A URL is signed once per
object and reused (a signature costs about 0.45 ms), so a read costs one kept-alive request.

Settings are botocore's own, resolved as boto3 and s3fs resolve them: the credentials
(``AWS_ACCESS_KEY_ID`` ..., ``AWS_PROFILE``, the shared files, a role), the region
(``AWS_DEFAULT_REGION``, the profile), the endpoint (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``,
the profile's ``endpoint_url``) and the CA bundle (``AWS_CA_BUNDLE``: trusted for the signed URLs'
hosts, :func:`feedfast.shards.transport.httpconn.trust`). :func:`signer` declines (None: the reads stay on
fsspec) where signing here could read otherwise than s3fs would: s3fs configured through fsspec
(``FSSPEC_S3_*`` variables or fsspec's config files: an endpoint, keys, ``anon``, requester pays),
or no credentials at all (a public bucket read anonymously).

A URL is signed for :data:`EXPIRES` seconds and signed again once it is :data:`RESIGN` seconds old,
so no request carries an older signature: botocore refreshes temporary credentials (a role's, an
SSO session's) at least 10 minutes before they expire, and a URL signed with them is valid until
then. A signed URL is a bearer token for its object: messages name the ``s3://`` URL, never it.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from typing import Any

from feedfast.errors import ShardError
from feedfast.shards.transport import httpconn

EXPIRES = 3600
"""Seconds a signed URL is valid for (S3 allows up to 7 days)."""
RESIGN = 300
"""Seconds after which an object's URL is signed again (well inside the 10 minutes botocore keeps on credentials)."""


class Signer:
    """Presigned GETs of s3 objects by one botocore client (and one per other region a bucket lives in)."""

    def __init__(self, client: Any, ca_bundle: str | None) -> None:
        self._clients = {client.meta.region_name: client}
        self._region, self._ca_bundle = client.meta.region_name, ca_bundle
        self._urls: dict[tuple[str, str], tuple[float, str]] = {}  # (s3 URL, region) -> (signed at, signed URL)
        self._errors = _botocore_error()
        self._lock = threading.Lock()

    def url(self, url: str, *, region: str | None = None, fresh: bool = False) -> str:
        """A presigned GET of ``url`` (``s3://bucket/key``), at most :data:`RESIGN` seconds old.

        Args:
            region: sign for this region (the bucket's, as S3 named it refusing a request) instead of the configured one.
            fresh: sign again now (S3 refused the last URL).
        """
        region = region or self._region
        now = time.monotonic()
        with self._lock:
            found = self._urls.get((url, region))
            if found is not None and not fresh and now - found[0] < RESIGN:
                return found[1]
            bucket, key = split(url)
            try:
                signed: str = self._client(region).generate_presigned_url(
                    "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=EXPIRES)
            except self._errors as exc:  # botocore's own (credentials gone, a profile broken meanwhile)
                raise ShardError(f"cannot sign a GET of shard {url!r} with botocore's settings: {exc}") from exc
            self._urls[url, region] = (now, signed)
        host = urllib.parse.urlsplit(signed)
        if self._ca_bundle and host.scheme == "https":
            httpconn.trust(host.netloc, self._ca_bundle)
        return signed

    def _client(self, region: str) -> Any:
        """The client that signs for ``region`` (made the first time a bucket there is read); under the lock."""
        if region not in self._clients:
            self._clients[region] = _session().create_client("s3", region_name=region, config=_config())
        return self._clients[region]


_lock = threading.Lock()
_signers: dict[str, Signer | None] = {}  # "s3": the process's signer, or None when signing here declines


def signer() -> Signer | None:
    """The process's signer, made from the settings the first time (None: the reads stay on fsspec, see above).

    Raises:
        ShardError: botocore cannot read its settings (a profile that is not there, a broken config file).
    """
    with _lock:
        if "s3" not in _signers:
            _signers["s3"] = _make_signer()
        return _signers["s3"]


def clear() -> None:
    """Forget the signer: the next read resolves the settings again (after they changed: tests do this)."""
    with _lock:
        _signers.clear()


def split(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key); a key is taken as it is (it may hold ``?`` and ``#``)."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return bucket, key


def _make_signer() -> Signer | None:
    try:
        session = _session()
    except ImportError:
        return None  # s3fs brings botocore; without them fsspec's error says what to install
    try:
        if _fsspec_settings() or session.get_credentials() is None:
            return None
        return Signer(session.create_client("s3", config=_config()), session.get_config_variable("ca_bundle"))
    except _botocore_error() as exc:
        raise ShardError(f"cannot read s3 shards: botocore cannot read its settings: {exc}") from exc


def _botocore_error() -> type[Exception]:
    from botocore.exceptions import BotoCoreError

    return BotoCoreError


def _session() -> Any:
    import botocore.session

    return botocore.session.get_session()


def _config() -> Any:
    from botocore.config import Config

    return Config(signature_version="s3v4")


def _fsspec_settings() -> bool:
    """Whether s3fs has settings of its own in fsspec's config (``FSSPEC_S3_*``, fsspec's config files)."""
    try:
        import fsspec.config
    except ImportError:
        return False
    return bool(fsspec.config.conf.get("s3"))
