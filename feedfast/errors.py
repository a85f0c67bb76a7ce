"""One exception family for everything feedfast raises on purpose.

Errors from DALI, torch, tarfile and the network are translated where they enter
feedfast (``raise ... from exc``) so callers catch one family.
"""

from __future__ import annotations


class FeedfastError(Exception):
    """Base class of every error feedfast raises on purpose."""


class UserError(FeedfastError):
    """A mistake in what the user gave (a path, an argument, a spec); the CLI exits 2."""


class SpecError(UserError):
    """A pipeline spec is invalid: names the file, key path, value, what is allowed and the fix."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        value: object = None,
        allowed: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.file = file
        self.key = key
        self.value = value
        self.allowed = allowed
        self.fix = fix
        where = f"{file or '<spec>'}"
        if key:
            where += f": {key}"
        parts = [f"{where}: {message}"]
        if value is not None:
            parts.append(f"got {value!r}")
        if allowed:
            parts.append(f"allowed: {allowed}")
        if fix:
            parts.append(f"fix: {fix}")
        super().__init__("; ".join(parts))


class ShardError(UserError):
    """A shard is missing, unreadable, not a tar, or truncated; names the shard."""


class SampleError(FeedfastError):
    """A sample could not be decoded or is incomplete; names the shard and the sample key."""

    def __init__(self, message: str, *, shard: str, key: str, reason: str) -> None:
        self.shard = shard
        self.key = key
        self.reason = reason
        super().__init__(f"{message}: shard {shard!r}, sample {key!r}: {reason}")


class BackendError(FeedfastError):
    """A backend (DALI or PIL) cannot run what the plan asks, or failed while running it."""
