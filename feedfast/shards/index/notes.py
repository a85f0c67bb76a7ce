"""What feedfast records about a shard on its index's first line, after ``v1.2 <N>``.

DALI's reader reads the version and the sample count from the first line of an index and
ignores what follows on that line (seen with DALI 2.4), so feedfast keeps there what it
learned when it indexed the shard, as ``name=value`` words::

    v1.2 8 fingerprint=9f2c41d07a3be150 repeated=b,c damaged=shard%20is%20truncated...

- ``fingerprint``: :func:`~feedfast.shards.index.check.shard_fingerprint` of the shard when it
  was indexed: an index whose shard was rewritten in place since (same size and modification
  time) is not used.
- ``repeated``: keys of samples left out because an earlier sample of the shard has the key.
- ``damaged``: the error the tar's damage raises (naming shard and byte offset), when the index
  lists the complete samples before it (``on_error: skip``); ``lost``: the keys of samples
  left out because the damage cut them.

Values are %-escaped (:func:`urllib.parse.quote`, every byte but letters, digits and ``_.-~``),
so no word holds a space or a comma; lists are comma-separated. An index without these words
(``wds2idx``'s, an older feedfast's) reads as one with no notes.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

UNKNOWN_KEY = "?"  # the key of "the samples after the damage", whose keys cannot be read
REPEATED = "repeats the key of an earlier sample of this shard: only the first sample of a key is read"


@dataclass(frozen=True)
class IndexNotes:
    """The words after ``v1.2 <N>`` on an index's first line (see the module docstring)."""

    count: int
    fingerprint: str = ""
    repeated: tuple[str, ...] = ()
    damaged: str = ""
    lost: tuple[str, ...] = ()

    def header(self, version: str) -> str:
        """The first line of an index (without its newline)."""
        words = [version, str(self.count)]
        if self.fingerprint:
            words.append(f"fingerprint={_quote(self.fingerprint)}")
        if self.repeated:
            words.append("repeated=" + ",".join(map(_quote, self.repeated)))
        if self.damaged:
            words.append(f"damaged={_quote(self.damaged)}")
            if self.lost:
                words.append("lost=" + ",".join(map(_quote, self.lost)))
        return " ".join(words)

    def left_out(self) -> list[tuple[str, str]]:
        """(key, reason) of every sample of the shard the index leaves out: repeated keys, and under
        damage the samples it cut (the key ``?`` standing for those after it, whose keys are unknown)."""
        out = [(key, REPEATED) for key in self.repeated]
        if self.damaged:
            out += [(key, f"{self.damaged}; this sample is cut by the damage") for key in self.lost]
            out.append((UNKNOWN_KEY, f"{self.damaged}; the samples after the damage cannot be read"))
        return out


def parse_header(line: str, version: str) -> IndexNotes:
    """The notes of an index's first line.

    Raises:
        ValueError: the line is not ``<version> <N> [words]`` with ``N`` a non-negative integer.
    """
    words = line.split()
    if len(words) < 2 or words[0] != version or not words[1].isdigit() or not words[1].isascii():
        raise ValueError(f"the first line is {line[:60]!r}, not '{version} <number of samples>'")
    fields: dict[str, str] = {}
    for word in words[2:]:
        name, sep, value = word.partition("=")
        if sep:
            fields[name] = value
    return IndexNotes(int(words[1]), _unquote(fields.get("fingerprint", "")), _list(fields.get("repeated", "")),
                      _unquote(fields.get("damaged", "")), _list(fields.get("lost", "")))


def _quote(text: str) -> str:
    return quote(text, safe="", errors="surrogateescape")


def _unquote(text: str) -> str:
    return unquote(text, errors="surrogateescape")


def _list(text: str) -> tuple[str, ...]:
    return tuple(_unquote(item) for item in text.split(",")) if text else ()
