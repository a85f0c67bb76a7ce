"""A tar member scanner that reads headers straight from a memory map, as :mod:`tarfile` reads them.

:func:`scan_members` gives the (name, data offset, size) of every regular file of a tar, in
tar order, exactly as ``[(m.name, m.offset_data, m.size) for m in tarfile.open(path) if
m.isreg()]`` does, about ten times faster: the file is memory-mapped (only the pages of
headers are read when members are large), each 512-byte header is parsed once, and the
checksums and number fields of all headers are verified together with NumPy.

What it reads as :mod:`tarfile` does: ustar names with their ``prefix`` field, v7 directories
(a regular-file type whose name ends in ``/``), PAX extended (``x``, ``X``) and global (``g``)
headers' ``path`` and ``size`` records (``hdrcharset=BINARY`` included), GNU long names
(``L``) and long links (``K``), base-256 number fields, the signed and unsigned checksums.
A GNU sparse member (type ``S``, or ``GNU.sparse.*`` PAX records; ``tar --sparse``) is an
error: its data is not one byte range, so no index can describe it (an index of tarfile's
offset and size would read the wrong bytes).

Damage is an error naming the shard and the offset (:class:`~feedfast.errors.ShardError`):
a member whose data runs past the end of the file, a header cut short, a header whose
checksum or number fields are wrong, an extension header with nothing valid after it, a
negative size, and, unlike :mod:`tarfile`, a tar that ends without an end-of-archive block
where the next header should be (a tar cut exactly at a member boundary; tarfile reads it
as complete, and its last samples would be lost without a word). Bytes after the first
end-of-archive block are not read, as tarfile does not read them.

:func:`salvage_members` reads a damaged tar as far as it can: the members before the damage,
and the damage itself (:class:`Damage`), so that a damaged shard costs only its damaged
samples (``on_error: skip``). A compressed file (gzip, bzip2, xz, zstd: ``.tar.gz``, ``.tgz``) is
refused by name under either: its members have no byte offsets to index, and random access into
a gzip stream means decompressing it from the start (see :func:`compression_of`).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from feedfast.errors import ShardError
from feedfast.shards.tar.fields import ENCODING, first_bad_header, number, pax_records

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
REGULAR = frozenset(b"0\x007S")  # tarfile.REGULAR_TYPES: isreg()
SUPPORTED = frozenset(b"0\x00125647LKS")  # tarfile.SUPPORTED_TYPES: the data of other types is skipped
GNU_TYPES = frozenset(b"LKS")  # these take no ustar prefix
EXTENDED = frozenset(b"xX")  # PAX extended header (X: Solaris's)
DIRECTORY = ord("5")
VERIFY_BATCH = 4096  # headers verified together (2 MiB of them)
Found = tuple[str, int, int]  # (member name, data offset, size)
# the magic bytes of the compressed formats tar files come in, and how to unpack each
COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip -k {path}  (or: gzip -dc {path} > {stem}.tar)"),
              (b"BZh", "bzip2", "bunzip2 -k {path}"),
              (b"\xfd7zXZ\x00", "xz", "unxz -k {path}"),
              (b"\x28\xb5\x2f\xfd", "zstd", "unzstd {path}"))


@dataclass(frozen=True)
class Damage:
    """Where a tar stops being readable.

    Attributes:
        offset: the byte where the damage starts (a header that cannot be read, or the header
            of a member whose data runs past the end of the file).
        message: the error that names shard, offset and reason (as :func:`scan_members` raises it).
        member: the name of the damaged member when its header could be read, else None (the
            file is cut, or garbage stands where a header should be).
    """

    offset: int
    message: str
    member: str | None = None


def scan_members(path: str, *, name: str | None = None) -> list[Found]:
    """(name, data offset, size) of every regular file in the tar at ``path``, in tar order.

    ``name``: the shard's name in messages when it is not ``path`` (a cached copy of a remote
    shard is named by its URL).

    Raises:
        ShardError: the file is missing, unreadable, compressed, not a tar, truncated or corrupt,
            or holds a sparse member (see the module docstring); names the shard, and the offset
            where it is damaged.
    """
    return _open_scan(path, salvage=False, name=name)[0]


def salvage_members(path: str, *, name: str | None = None) -> tuple[list[Found], Damage | None]:
    """The members :func:`scan_members` gives, or, in a damaged tar, the members whose headers and
    data lie wholly before the damage, and the damage (``name`` as for :func:`scan_members`).

    Raises:
        ShardError: the file is missing, unreadable, compressed or holds a sparse member (no part
            of it is damaged: it cannot be read as it is).
    """
    return _open_scan(path, salvage=True, name=name)


def compression_of(head: bytes) -> tuple[str, str] | None:
    """(format, the command that unpacks it) of a compressed file starting with ``head``; None for others."""
    for magic, name, command in COMPRESSED:
        if head.startswith(magic):
            return name, command
    return None


def _compressed(path: str, head: bytes) -> ShardError | None:
    found = compression_of(head)
    if found is None:
        return None
    name, command = found
    stem = path[: -len(".tar.gz")] if path.endswith(".tar.gz") else path.rsplit(".", 1)[0]
    return ShardError(f"shard {path!r} is {name}-compressed: feedfast reads uncompressed tar files only (a "
                      f"compressed tar has no byte offsets to index, and reading one sample means decompressing "
                      f"the stream from its start); unpack it once: {command.format(path=path, stem=stem)}")


def _open_scan(path: str, *, salvage: bool, name: str | None = None) -> tuple[list[Found], Damage | None]:
    shown = path if name is None else name  # what messages call the shard
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                error = ShardError(f"shard is not a readable tar file: {shown!r} (empty file)")
                if salvage:
                    return [], Damage(0, str(error))
                raise error
            head = os.pread(f.fileno(), BLOCK, 0)
            refused = _compressed(shown, head) if len(head) < BLOCK or first_bad_header([head]) is not None else None
            if refused is not None:  # a valid tar header whose name starts like a magic number is a tar
                raise refused
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                return _Scan(view, size, shown).run(salvage=salvage)
    except FileNotFoundError as exc:
        raise ShardError(f"shard not found: {shown!r}") from exc
    except PermissionError as exc:
        raise ShardError(f"shard not readable: {shown!r} ({exc.strerror})") from exc
    except IsADirectoryError as exc:
        raise ShardError(f"shard is a directory, not a tar file: {shown!r}") from exc


def padded(size: int) -> int:
    """``size`` rounded up to whole blocks (tarfile's ``_block``; 0 for a negative size)."""
    return max(0, -(-size // BLOCK) * BLOCK)


def nts(field: bytes) -> str:
    """A NUL-terminated field as text (tarfile's ``nts``, with tarfile's default encoding and errors)."""
    end = field.find(0)
    return (field if end < 0 else field[:end]).decode(ENCODING, "surrogateescape")


class _Scan:
    """One pass over a mapped tar: the headers' offsets and bytes, the members found, the PAX globals."""

    def __init__(self, view: mmap.mmap, size: int, path: str) -> None:
        self.view, self.size, self.path = view, size, path
        self.offsets: list[int] = []
        self.headers: list[bytes] = []
        self.globals: dict[str, str] = {}

    def run(self, *, salvage: bool = False) -> tuple[list[Found], Damage | None]:
        """The members; at damage, raise (or, with ``salvage``, the members wholly before it and the damage)."""
        found: list[Found] = []
        pos = 0
        try:
            while True:
                pos = self._plain_files(pos, found)
                step = self._member(pos)
                if step is None:
                    break
                member, pos = step
                if member is not None:
                    found.append(member)
            self._verify(upto=pos)
        except _Damage as damage:
            first = self._first_bad(upto=damage.offset) or damage  # an unverified header before it is the damage
            if isinstance(first, _Sparse) or not salvage:
                raise self._error(first) from None
            kept = [m for m in found if m[1] - BLOCK < first.offset]
            return kept, Damage(first.offset, str(self._error(first)), first.member)
        return found, None

    def _error(self, damage: _Damage) -> ShardError:
        if isinstance(damage, _Sparse):
            return ShardError(f"shard {self.path!r} holds a GNU sparse member at offset {damage.offset} ({damage.reason}): "
                              "its data is not one byte range, so it cannot be indexed; write the tar without --sparse")
        if isinstance(damage, _Truncated):
            return ShardError(f"shard is truncated: {self.path!r}: at offset {damage.offset}: {damage.reason}")
        if damage.offset == 0:
            return ShardError(f"shard is not a readable tar file: {self.path!r} ({damage.reason})")
        return ShardError(f"shard is truncated or corrupt: {self.path!r}: at offset {damage.offset}: {damage.reason}")

    def _first_bad(self, upto: int) -> _Damage | None:
        """The first header kept, at or before offset ``upto``, whose checksum or number fields are wrong."""
        bad = first_bad_header(self.headers)
        if bad is not None and self.offsets[bad] <= upto:
            return _Damage(self.offsets[bad], NOT_A_HEADER)
        return None

    def _verify(self, upto: int) -> None:
        """Raise for the first bad header kept at or before offset ``upto`` (:meth:`_first_bad`); then forget
        them (headers are verified a batch at a time, so memory stays small)."""
        bad = self._first_bad(upto)
        if bad is not None:
            raise bad
        self.offsets.clear()
        self.headers.clear()

    def _keep(self, pos: int, block: bytes) -> None:
        self.offsets.append(pos)
        self.headers.append(block)
        if len(self.headers) >= VERIFY_BATCH:
            self._verify(upto=pos)

    def _plain_files(self, pos: int, found: list[Found]) -> int:
        """Read the run of plain headers from ``pos`` (regular files, ustar or GNU, no extension headers
        before them, no PAX globals): the common case, in one loop. Returns where it stopped."""
        if self.globals:
            return pos
        view, total, offsets, headers = self.view, self.size, self.offsets, self.headers
        while True:
            block = view[pos:pos + BLOCK]
            if len(block) != BLOCK or block[156] != 0x30 or block[345]:  # "0": a regular file, no ustar prefix
                return pos
            field = block[124:136]
            end = field.find(0)
            try:
                size = int(field if end < 0 else field[:end], 8)
            except ValueError:
                return pos
            start = pos + BLOCK
            if size < 0 or start + size > total:
                return pos
            end = block.find(0, 0, 100)
            found.append((block[:100 if end < 0 else end].decode(ENCODING, "surrogateescape"), start, size))
            offsets.append(pos)
            headers.append(block)
            if len(headers) >= VERIFY_BATCH:
                self._verify(upto=pos)
            pos = start + (size + BLOCK - 1) // BLOCK * BLOCK

    def _header(self, pos: int, chained: bool) -> bytes | None:
        """The 512 bytes of the header at ``pos``; None at the end-of-archive block."""
        block = self.view[pos:pos + BLOCK]
        if len(block) == BLOCK and block != ZERO_BLOCK:
            self._keep(pos, block)
            return block
        if chained:
            raise _Damage(pos, "no member header after an extension header")
        if len(block) == BLOCK:
            return None
        if pos >= self.size:
            cut = "exactly at a member boundary" if pos == self.size else f"at byte {self.size}, inside padding"
            raise _Damage(pos, f"the file ends {cut}, with no end-of-archive block after the last member: "
                               "it was probably cut short")
        raise _Damage(pos, f"a partial block of {len(block)} bytes where a member header or the end-of-archive "
                           "should be")

    def _member(self, pos: int) -> tuple[Found | None, int] | None:
        """The member whose headers start at ``pos`` (None if not a regular file) and the next offset;
        None at the end of the archive. Extension headers (L, K, x, X, g) chain to the header they describe."""
        chain: list[tuple[int, object]] = []
        while True:
            block = self._header(pos, chained=bool(chain))
            if block is None:
                return None
            kind = block[156]
            try:
                size = number(block[124:136])
            except ValueError:
                raise _Damage(pos, NOT_A_HEADER) from None
            if kind in b"LKxXg":
                data = self.view[pos + BLOCK:pos + BLOCK + padded(size)]
                value = nts(data) if kind == ord("L") else None if kind == ord("K") else self._pax(data, kind, pos)
                chain.append((kind, value))
                pos += BLOCK + padded(size)
                continue
            if kind == ord("S"):
                raise _Sparse(pos, "type S")
            return self._builtin(block, kind, size, pos, chain)

    def _builtin(self, block: bytes, kind: int, size: int, pos: int,
                 chain: list[tuple[int, object]]) -> tuple[Found | None, int]:
        """tarfile's frombuf and _proc_builtin, then the chained extension headers applied innermost first."""
        name = nts(block[:100])
        if kind == 0 and name.endswith("/"):
            kind = DIRECTORY
        if kind == DIRECTORY:
            name = name.rstrip("/")
        if block[345] and kind not in GNU_TYPES:
            name = nts(block[345:500]) + "/" + name
        start = pos + BLOCK
        skips = kind in REGULAR or kind not in SUPPORTED
        name, size = self._apply(self.globals, name, size)
        if kind == DIRECTORY:
            name = name.rstrip("/")
        end = start + (padded(size) if skips else 0)
        for ext, value in reversed(chain):
            if ext == ord("L"):
                name = str(value)
                name = name.removesuffix("/") if kind == DIRECTORY else name
            elif ext in EXTENDED and isinstance(value, dict):
                name, size = self._apply(value, name, size)
                if "size" in value:
                    end = start + (padded(size) if skips else 0)
        if kind not in REGULAR:
            return None, end
        if size < 0:
            raise _Damage(pos, f"member {name!r} has a negative size ({size})", member=name)
        if start + size > self.size:
            raise _Truncated(pos, f"member {name!r} needs bytes up to {start + size} but the file has {self.size}",
                             member=name)
        return (name, start, size), end

    @staticmethod
    def _apply(pax: dict[str, str], name: str, size: int) -> tuple[str, int]:
        """tarfile's _apply_pax_info, for the fields an index needs."""
        if "path" in pax:
            name = pax["path"].rstrip("/")
        if "size" in pax:
            try:
                size = int(pax["size"])
            except ValueError:
                size = 0
        return name, size

    def _pax(self, data: bytes, kind: int, pos: int) -> dict[str, str]:
        """The records of a PAX header, over the globals (a global header updates them in place)."""
        pax = self.globals if kind == ord("g") else dict(self.globals)
        try:
            pax_records(data, pax)
        except ValueError as exc:
            raise _Damage(pos, f"a PAX header that cannot be read ({exc})") from None
        sparse = next((k for k in pax if k.startswith("GNU.sparse.")), None)
        if sparse is not None:
            raise _Sparse(pos, f"PAX record {sparse}")
        return pax


NOT_A_HEADER = "a block that is not a valid tar header (wrong checksum or number fields) where a member header should be"


class _Damage(Exception):
    """Where and why a tar cannot be read (made into a ShardError naming the shard)."""

    def __init__(self, offset: int, reason: str, member: str | None = None) -> None:
        super().__init__(reason)
        self.offset, self.reason, self.member = offset, reason, member


class _Sparse(_Damage):
    """A GNU sparse member, which no index can describe."""


class _Truncated(_Damage):
    """A member whose data runs past the end of the file."""
