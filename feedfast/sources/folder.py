"""A dataset of images read in place: an image folder (torchvision's ``ImageFolder`` layout) or a file list.

``DataLoader(spec, shards="data/train/")`` (a folder), ``shards="train.txt"`` or ``shards="train.csv"`` (a
file list, :mod:`feedfast.files.filelist`) opens a :class:`FolderSet`: the listing of
:mod:`feedfast.files` presented as a dataset of one "shard", the folder, so the orders of
:mod:`feedfast.order` (the permutation, the deal to ranks, elastic cursors) run over it unchanged.
Sample ``i`` is file ``i`` of the listing, in torchvision's order.

The spec's components map onto a file as follows: the one ``image`` component is the file itself
(whatever its extension: a file torchvision lists is an image to decode), a ``label`` component
is the file's label from the listing (its class index; a file list's label), given to the
``label`` op as the ASCII digits a ``.cls`` member holds. Any other component kind has nothing
to read in a folder and is refused when the dataset is opened.

Images are not checked when the folder is opened (that would decode every file of a large
folder before the first batch); they are checked as they are read. A file missing, unreadable or
changed since the listing (another size) is a :class:`~feedfast.errors.SampleError` naming the
folder (as the shard) and the file's relative path (as the key); under ``on_error: skip`` it and
an image that does not decode are left out of their batch and counted, each time
(:meth:`FolderSet.checks_when_read`), as a remote shard's lost rows are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from feedfast.errors import UserError
from feedfast.files.table import FileTable
from feedfast.sources.folderindex import FolderIndex, FolderMembers
from feedfast.spec.model import Spec

LIST_SUFFIXES = (".txt", ".csv")
"""A single local file of these endings given as ``shards=`` is a file list of images, not a shard."""


def is_folder_source(shards: Any) -> bool:
    """Whether ``DataLoader(shards=...)`` names images in place: one local folder, or one file list."""
    if not isinstance(shards, (str, os.PathLike)):
        return False
    given = os.path.expanduser(os.fspath(shards))
    if given.startswith("@") or "://" in given:
        return False
    return os.path.isdir(given) or (given.lower().endswith(LIST_SUFFIXES) and os.path.isfile(given))


@dataclass(frozen=True)
class FolderSet:
    """Images read in place, as a dataset of one shard (the folder); see the module docstring.

    It has what the loader reads of a :class:`~feedfast.sources.dataset.ShardSet` (``paths``,
    ``sizes``, ``skipped``, ``read_kinds``, ``row_index``, ``members``, ...), with the folder's values.

    Attributes:
        table: the listing (:class:`~feedfast.files.table.FileTable`).
        roles: each component's extensions (lower case) -> ``file`` or ``label``.
        given: what the user passed (the folder or the file list), for messages.
        skip: ``on_error: skip``: a file that cannot be read or decoded is a counted skip, not an error.
        cache_dir: feedfast's cache folder.
    """

    table: FileTable
    roles: dict[frozenset[str], str]
    given: str
    skip: bool = False
    cache_dir: str = ""
    skipped: tuple[tuple[str, str, str], ...] = ()
    converted: tuple[tuple[str, str, str], ...] = ()
    kinds: tuple[str, ...] = ()
    index_paths: tuple[str, ...] = ()
    shuffle: Any = None
    cache: Any = None
    transfer: Any = None
    source_kind: str = field(default="folder", init=False)

    @property
    def paths(self) -> tuple[str, ...]:
        """The one "shard": the listing's root folder (what errors and a batch's origins name)."""
        return (self.table.root,)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Samples in the one shard: the listed files."""
        return (len(self.table),)

    @property
    def total(self) -> int:
        """The listed files."""
        return len(self.table)

    @property
    def read_kinds(self) -> tuple[str, ...]:
        """Local files: ``file``."""
        return ("file",)

    @property
    def raw_bytes(self) -> int:
        """The listed files' bytes."""
        return self.table.counts()[0]

    @property
    def bytes(self) -> int:
        """The listed files' bytes."""
        return self.raw_bytes

    @property
    def checks_when_read(self) -> bool:
        """Whether a sample that fails as it is read is a counted skip (``on_error: skip``; the images were not
        checked when the dataset was opened)."""
        return self.skip

    @property
    def identity(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """What a loader state must match: the folder and a digest of its listing (paths and labels)."""
        return (self.table.root, f"listing:{self.table.content_digest()}"), (len(self.table), 0)

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes in label order (a folder's class folders; empty for a file list)."""
        return self.table.class_names

    def row_index(self, exts: Sequence[set[str] | frozenset[str]]) -> FolderIndex:
        """The rows of these components (each one's extensions), as a columnar index's
        (:class:`~feedfast.sources.folderindex.FolderIndex`)."""
        return FolderIndex(self.table, self._roles_of(exts))

    def members(self, exts: Sequence[set[str] | frozenset[str]]) -> FolderMembers:
        """The reader of these components' bytes (:class:`~feedfast.sources.folderindex.FolderMembers`)."""
        return FolderMembers(self.table, self._roles_of(exts))

    def _roles_of(self, exts: Sequence[set[str] | frozenset[str]]) -> tuple[str, ...]:
        try:
            return tuple(self.roles[frozenset(e)] for e in exts)
        except KeyError as exc:
            raise UserError(f"{self.given!r}: no component of the spec has the extensions {sorted(exc.args[0])}") \
                from None


def open_folder(given: str | os.PathLike[str], spec: Spec, cache_dir: Path, *, on_error: str | None = None,
                **_: Any) -> FolderSet:
    """List an image folder or read a file list (cached, :mod:`feedfast.files`) and map the spec's components.

    Raises:
        UserError: the spec has no image component, more than one, or a component a folder cannot give.
        ShardError: the folder or list cannot be read, or holds no image (names it and the fix).
    """
    from feedfast.files.filelist import read_file_list
    from feedfast.files.listing import list_folder

    name = os.path.expanduser(os.fspath(given))
    policy = on_error or spec.on_error
    roles = _roles(name, spec)
    table = list_folder(name, cache_dir=cache_dir) if os.path.isdir(name) else \
        read_file_list(name, cache_dir=cache_dir)
    return FolderSet(table, roles, name, skip=policy == "skip", cache_dir=str(cache_dir))


def _roles(name: str, spec: Spec) -> dict[frozenset[str], str]:
    """Each component's extensions -> ``file`` (the one image component) or ``label``."""
    images = [c.name for c in spec.components.values() if c.kind == "image"]
    if len(images) != 1:
        raise UserError(f"{name!r} is read in place, one image per sample, and the spec has {len(images)} image "
                        f"components ({', '.join(images) or 'none'}): keep exactly one `kind: image` component")
    roles: dict[frozenset[str], str] = {}
    for c in spec.components.values():
        if c.kind not in ("image", "label"):
            raise UserError(f"{name!r} is read in place: a sample is one image and its label, so component "
                            f"{c.name!r} (kind {c.kind!r}) has nothing to read; remove it from source.components, "
                            "or write shards (`feedfast shards make`) to carry it")
        roles[frozenset(c.ext.lower().split(";"))] = "file" if c.kind == "image" else "label"
    return roles
