"""The signer of s3 GETs: botocore's settings, URLs reused and signed again in time, and when it declines for fsspec.

Signing is local (botocore computes it): nothing here reaches a network; instance metadata is switched off.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Iterator

import pytest

from feedfast.errors import ShardError
from feedfast.shards.transport import httpconn, s3sign

pytest.importorskip("botocore", reason="the s3 signer is botocore's: pip install -e '.[dev]'")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """Fake credentials and a loopback endpoint in the AWS variables, no config files, a fresh signer."""
    nowhere = str(tmp_path / "no-aws-config")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": nowhere,
                        "AWS_SHARED_CREDENTIALS_FILE": nowhere}.items():
        monkeypatch.setenv(name, value)
    s3sign.clear()
    yield monkeypatch
    s3sign.clear()


def _query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


def test_a_url_is_signed_by_botocores_settings_and_reused_until_it_is_resign_seconds_old(
        aws: pytest.MonkeyPatch) -> None:
    signer = s3sign.signer()
    assert signer is not None and s3sign.signer() is signer  # made once
    url = signer.url("s3://bucket/a dir/train-0000.tar")
    parts = urllib.parse.urlsplit(url)
    assert (parts.netloc, parts.path) == ("127.0.0.1:9", "/bucket/a%20dir/train-0000.tar")  # AWS_ENDPOINT_URL
    query = _query(url)
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256" and query["X-Amz-Expires"] == str(s3sign.EXPIRES)
    assert query["X-Amz-Credential"].startswith("testing/") and "/us-east-1/s3/" in query["X-Amz-Credential"]
    assert s3sign.split("s3://bucket/a/b?c#d.tar") == ("bucket", "a/b?c#d.tar")  # S3 keys may hold ? and #
    assert urllib.parse.urlsplit(signer.url("s3://bucket/a?b#c.tar")).path == "/bucket/a%3Fb%23c.tar"
    signed: list[str] = []
    client = signer._client("us-east-1")
    sign = client.generate_presigned_url
    aws.setattr(client, "generate_presigned_url", lambda *a, **kw: signed.append(kw["Params"]["Key"]) or sign(*a, **kw))
    clock = [1000.0]
    aws.setattr(s3sign.time, "monotonic", lambda: clock[0])
    first = signer.url("s3://bucket/b.tar")
    clock[0] += s3sign.RESIGN - 1
    assert signer.url("s3://bucket/b.tar") == first and signed == ["b.tar"]  # reused while fresh
    clock[0] += 2
    signer.url("s3://bucket/b.tar")  # RESIGN seconds old: signed again
    signer.url("s3://bucket/b.tar", fresh=True)  # S3 refused the last one: signed again at once
    assert signed == ["b.tar"] * 3


def test_a_bucket_in_another_region_is_signed_for_it(aws: pytest.MonkeyPatch) -> None:
    signer = s3sign.signer()
    assert signer is not None
    url = signer.url("s3://bucket/a.tar", region="eu-west-1")
    assert "/eu-west-1/s3/" in _query(url)["X-Amz-Credential"]
    assert "/us-east-1/s3/" in _query(signer.url("s3://bucket/a.tar"))["X-Amz-Credential"]


def test_the_ca_bundle_is_trusted_for_the_hosts_of_https_urls(aws: pytest.MonkeyPatch) -> None:
    certifi = pytest.importorskip("certifi")  # a CA bundle file to point AWS_CA_BUNDLE at (botocore's dependencies)

    aws.setenv("AWS_ENDPOINT_URL", "https://store.invalid:8443")
    aws.setenv("AWS_CA_BUNDLE", certifi.where())
    aws.setattr(httpconn, "_TRUSTED", {})
    signer = s3sign.signer()
    assert signer is not None
    assert urllib.parse.urlsplit(signer.url("s3://bucket/a.tar")).netloc == "store.invalid:8443"
    assert set(httpconn._TRUSTED) == {"store.invalid:8443"}


def test_it_declines_for_fsspecs_own_s3_settings_and_without_credentials(aws: pytest.MonkeyPatch) -> None:
    import fsspec.config

    aws.setitem(fsspec.config.conf, "s3", {"anon": True})  # FSSPEC_S3_ANON, or fsspec's config files
    assert s3sign.signer() is None
    aws.delitem(fsspec.config.conf, "s3")
    s3sign.clear()
    aws.delenv("AWS_ACCESS_KEY_ID")
    aws.delenv("AWS_SECRET_ACCESS_KEY")
    assert s3sign.signer() is None  # a public bucket read anonymously: fsspec's reads
    s3sign.clear()


def test_a_profile_that_is_not_there_is_an_error_naming_it(aws: pytest.MonkeyPatch) -> None:
    aws.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(ShardError, match=r"botocore cannot read its settings: .*no-such-profile"):
        s3sign.signer()
