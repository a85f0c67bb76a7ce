"""s3:// and gs:// shards read from Python through fsspec (s3fs, gcsfs), to index them.

DALI's webdataset reader reads these shards itself (its own AWS and GCS clients); feedfast
only needs each shard's index, fetched beside the shard or built by one scan. fsspec and
its backends are optional: without them, indexing fails with a ShardError saying what to
install.
"""

from __future__ import annotations

from typing import IO, Any, Callable, TypeVar

from feedfast.errors import ShardError

T = TypeVar("T")


def _not_found(url: str) -> ShardError:
    from feedfast.sources.remote import RemoteError  # remote imports this module

    return RemoteError(f"shard not found: {url!r}", url=url, status=404)


def _fsspec(url: str) -> Any:
    try:
        import fsspec
    except ImportError as exc:
        raise ShardError(f"cannot index {url!r}: feedfast reads s3:// and gs:// indexes through fsspec "
                         "(pip install s3fs, or gcsfs); DALI's reader then reads the shard itself") from exc
    return fsspec


def read(url: str, consume: Callable[[IO[bytes]], T]) -> T:
    """Open ``url`` with fsspec and hand the stream to ``consume``."""
    fsspec = _fsspec(url)
    try:
        with fsspec.open(url, "rb") as f:
            return consume(f)
    except ImportError as exc:  # fsspec is there but not s3fs/gcsfs
        raise ShardError(f"cannot index {url!r}: {exc}") from exc
    except FileNotFoundError as exc:
        raise _not_found(url) from exc


def info(url: str) -> dict[str, Any]:
    """fsspec's metadata of ``url`` (size, ETag, modification time)."""
    fsspec = _fsspec(url)
    try:
        fs, path = fsspec.core.url_to_fs(url)
        return dict(fs.info(path))
    except ImportError as exc:
        raise ShardError(f"cannot index {url!r}: {exc}") from exc
    except FileNotFoundError as exc:
        raise _not_found(url) from exc
