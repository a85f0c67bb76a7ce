"""``gpu_check.py``'s setup section (the required modules, brought from a packed site or from wheels
when missing), and the helper that makes the pieces on a machine with network.

Making the pieces (``make gpu-wheels``, or ``python benchmarks/gpucheck_wheels.py --out DIR``) where pip
reaches PyPI, a Python 3.12 is at hand (``--build-python``, else ``python3.12`` on the PATH, else pyenv's) and
libjpeg's headers are installed:

1. :func:`download`: ``pip download`` fetches the wheels of :data:`PACKAGES` for the GPU machine (Python 3.12,
   manylinux x86_64, DALI for CUDA 13, no dependencies resolved: the list is complete) into ``DIR/build``.
2. :func:`build_site` installs them into one site folder (``pip install --target --python-version 3.12``)
   and :func:`prune` drops what that machine never loads: the extension modules of other Pythons (DALI and
   nvImageCodec carry one per Python from 3.9 to 3.15), ``__pycache__`` and ``tests`` folders, and
   :data:`UNUSED`'s headers and tools.
3. :func:`build_extensions` builds feedfast's three C extensions (``_native``, ``_plan``, ``_augment``) with
   that Python 3.12, linked with rpath ``$ORIGIN``, into the site's ``feedfast-ext/`` with the libjpeg they
   link (``libjpeg.so.62``) beside them and the hashes of the C sources they came from (``SOURCES``): the
   GPU machine has neither libjpeg's headers to build them nor a libjpeg to load.
4. :func:`pack_site` packs the site with xz (``-9e``, blocks of 256 MiB on all cores: 3.5 minutes on 2
   cores) and cuts it evenly into ``DIR/site-py312.tar.xz.part-1-of-N`` ... ``part-N-of-N`` of at most
   :data:`PIECE_BYTES`: the only files to copy. For DALI 2.4: 504 MiB unpacked, 167.7 MB packed, three
   pieces of 55.9 MB (``-8`` in xz's default blocks made 172.3 MB: four).

On the GPU machine: copy the N pieces into one folder, then ``make gpu-check WHEELS=that-folder`` (or
``python benchmarks/gpu_check.py --wheels that-folder``). The setup section checks that all N pieces are
there (a missing one is named), unpacks the site straight from them into the target (``--target``, default
``that-folder/site-py312``), puts it on ``sys.path`` and copies the C extensions into this checkout's
``feedfast/``, where an in-place build puts them. That and not the site: the checkout is first on
``sys.path`` and ``feedfast`` is a regular package, so no other ``feedfast`` folder is ever searched;
adding the site's folder to ``feedfast.__path__`` would hold in this process only, not in a fresh
interpreter the check starts, and only before feedfast's modules first try the import (they remember a
failed one). There every process that imports this checkout's feedfast finds them, with their libjpeg
beside them for ``$ORIGIN``. ``*.so`` is ignored by git, so the checkout stays clean; they are copied only
when this checkout's C sources are the ones they were built from (a stale extension is an error, not a
quiet fallback).

The older form still works: a folder of ``.whl`` files, or of ``wheels.tar.part-aa``, ``-ab``, ... pieces
(``--wheels-only`` makes them; :func:`pack`), installed there with ``pip install --no-index --no-deps
--target`` and without feedfast's C extensions. ``--from DIR`` takes wheels already downloaded.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib
import importlib.machinery
import io
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from gpucheck_common import REPO, REQUIRED, Context, Section, one_line, say

PACKAGES = (
    "nvidia-dali-cuda130", "nvidia-nvimgcodec-cu13", "nvidia-libnvcomp-cu13", "nvidia-nvjpeg",
    "astunparse", "gast", "libcst", "makefun", "nvtx", "optree", "six", "packaging",
    "webdataset", "braceexpand", "pyyaml", "psutil",
)
"""What the GPU machine lacks (it has torch, torchvision, numpy, PIL; see DALI-NOTES.md):
DALI for CUDA 13 with its libraries and pure-Python needs, and feedfast's own."""
PIECE_BYTES = 57_000_000
"""Largest piece: under the 58 MB a transfer to the GPU machine takes, read as 10**6 or 2**20 bytes."""
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")
EXTENSIONS = ("feedfast._native", "feedfast._plan", "feedfast._augment")
"""feedfast's optional C extensions (``setup.py``); the GPU machine cannot build them."""
EXT_DIR = "feedfast-ext"
"""The site's folder of the built extensions and their libjpeg (a name no import can reach)."""
UNUSED = ("bin", "nvidia/dali/include", "nvidia/nvimgcodec/include", "nvidia/nvimgcodec/tools", "nvidia/cu13/include",
          "nvidia/libnvcomp/include", "nvidia/libnvcomp/bin", "nvidia/libnvcomp/lib64/cmake")
"""Site folders nothing imports or loads: headers and CMake files for building against DALI and its
libraries, command-line tools."""
SITE = re.compile(r"site-py(\d)(\d+)\.tar\.xz")
"""The packed site's name: ``site-py312.tar.xz`` for Python 3.12."""
PIECE = re.compile(r"(?P<name>.+)\.part-(?:(?P<index>\d+)-of-(?P<count>\d+)|(?P<letters>[a-z]{2}))")
"""A piece: ``NAME.part-K-of-N`` (:func:`pack_site`) or ``NAME.part-aa`` (``split``, :func:`pack`)."""
STAMP = ".feedfast-gpu-check"
"""In the target: what was installed there (wheel names, or the site archive and its size)."""


def probe(names: Sequence[str]) -> dict[str, str]:
    """Import each module; map the ones that fail to ``Type: message``."""
    failed: dict[str, str] = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - DALI can raise OSError/RuntimeError for a missing library
            failed[name] = one_line(exc)
    return failed


# ---------------------------------------------------------------------------- pieces
def piece_names(folder: Path) -> list[str]:
    """The names of which ``folder`` holds pieces (``NAME`` for ``NAME.part-*``)."""
    return sorted({m["name"] for p in folder.iterdir() if (m := PIECE.fullmatch(p.name)) and p.is_file()})


def pieces_of(folder: Path, name: str) -> list[Path]:
    """``name``'s pieces in ``folder`` in order, all of them: a missing or short one is an error naming it.

    ``part-K-of-N`` pieces say how many there are, so any missing one is found; ``part-aa`` pieces can only
    show a gap. Every piece but the last has the largest one's size (so a transfer cut short is found).
    """
    found = [(m, p) for p in folder.iterdir() if (m := PIECE.fullmatch(p.name)) and m["name"] == name and p.is_file()]
    counted = [(int(m["index"]), int(m["count"]), p) for m, p in found if m["index"]]
    lettered = sorted((m["letters"], p) for m, p in found if m["letters"])
    if not found:
        raise RuntimeError(f"no {name}.part-* pieces in {folder}")
    if counted and lettered:
        raise RuntimeError(f"{folder}: {name} has pieces of two kinds (.part-K-of-N and .part-aa); keep one set")
    if counted:
        counts = sorted({n for _, n, _ in counted})
        if len(counts) != 1:
            raise RuntimeError(f"{folder}: {name} pieces of sets of {' and '.join(map(str, counts))}; keep one set")
        total = counts[0]
        have = {i: p for i, _, p in counted}
        if stray := sorted(p.name for i, _, p in counted if not 1 <= i <= total):
            raise RuntimeError(f"{folder}: {', '.join(stray)} is not a piece of {total}")
        missing = [f"{name}.part-{i}-of-{total}" for i in range(1, total + 1) if i not in have]
        if missing:
            raise RuntimeError(f"{folder}: missing {', '.join(missing)} ({len(have)} of {total} pieces here)")
        ordered = [have[i] for i in range(1, total + 1)]
    else:
        expected = [_letters(i) for i in range(len(lettered))]
        if missing := [f"{name}.part-{s}" for s in expected if s not in {s for s, _ in lettered}]:
            raise RuntimeError(f"{folder}: missing {', '.join(missing)} (pieces run from -aa without a gap)")
        ordered = [p for _, p in lettered]
    size = max(p.stat().st_size for p in ordered)
    for piece in ordered[:-1]:
        if piece.stat().st_size != size:
            raise RuntimeError(f"{piece}: {piece.stat().st_size} bytes where the largest piece has {size} "
                               "(a transfer cut short?): copy it again")
    return ordered


def _letters(index: int) -> str:
    return f"{chr(97 + index // 26)}{chr(97 + index % 26)}"


class _Joined(io.RawIOBase):
    """The pieces read as one file, without joining them on disk."""

    def __init__(self, pieces: Sequence[Path]) -> None:
        self.pieces = list(pieces)
        self.current: IO[bytes] | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            if self.current is None:
                if not self.pieces:
                    return 0
                self.current = self.pieces.pop(0).open("rb")
            count = self.current.readinto(buffer)
            if count:
                return count
            self.current.close()
            self.current = None

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None
        super().close()


def join_pieces(folder: Path) -> list[str]:
    """Join ``NAME.part-*`` wheel pieces into ``NAME``; unpack the wheels of a joined tar.

    A packed site's pieces (``site-py312.tar.xz.part-*``) are not joined: :func:`unpack_site` reads them.
    """
    done: list[str] = []
    for name in piece_names(folder):
        if SITE.fullmatch(name):
            continue
        pieces = pieces_of(folder, name)
        whole = folder / name
        size = sum(p.stat().st_size for p in pieces)
        if not whole.exists() or whole.stat().st_size != size:
            with whole.open("wb") as out, _Joined(pieces) as src:
                shutil.copyfileobj(src, out, 1 << 24)
        done.append(f"joined {len(pieces)} pieces into {name} ({size / 2**20:.0f} MiB)")
        if tarfile.is_tarfile(whole):
            done.append(f"unpacked {unpack_wheels(whole, folder)} wheels from {name}")
    return done


def unpack_wheels(archive: Path, folder: Path) -> int:
    """Write the ``.whl`` members of a tar into ``folder`` by base name; return how many."""
    count = 0
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = os.path.basename(member.name)
            if member.isfile() and name.endswith(".whl"):
                src = tar.extractfile(member)
                if src is None:
                    raise RuntimeError(f"{archive}: cannot read {member.name}")
                with src, (folder / name).open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 24)
                count += 1
    return count


# ---------------------------------------------------------------------------- installing wheels
def install_wheels(wheels: Sequence[Path], target: Path, timeout: float) -> str:
    """Install every wheel into ``target`` (once per set of wheels); say how."""
    stamp = target / STAMP
    want = "\n".join(sorted(w.name for w in wheels))
    if stamp.exists() and stamp.read_text(encoding="utf-8") == want:
        return f"already installed in {target}"
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--upgrade", "--no-compile",
           "--disable-pip-version-check", "--target", str(target), *map(str, wheels)]
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False).returncode == 0:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"pip install --target failed ({proc.returncode}): {tail[0]}")
        how = "pip install --no-index --no-deps --target"
    else:
        for wheel in wheels:
            unzip_wheel(wheel, target)
        how = "unzipped (pip is not available)"
    stamp.write_text(want, encoding="utf-8")
    return f"{how} {len(wheels)} wheels into {target}"


def unzip_wheel(wheel: Path, target: Path) -> None:
    """Install a wheel without pip: its files, with ``*.data/purelib|platlib`` moved to the top."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            dest = target.joinpath(*parts)
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, dest.open("wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                dest.chmod(mode)


def activate(target: Path) -> None:
    """Put ``target`` on ``sys.path`` (after what is installed) and on ``PYTHONPATH`` for children.

    An ``nvidia`` package already on the path as a regular package (CUDA wheels ship
    ``nvidia/__init__.py``) hides other ``nvidia`` folders, so ``target/nvidia`` is added to its
    ``__path__``.
    """
    if str(target) not in sys.path:
        sys.path.append(str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(target)) if p)
    importlib.invalidate_caches()
    portion = target / "nvidia"
    if not portion.is_dir():
        return
    nvidia = importlib.import_module("nvidia")
    path = getattr(nvidia, "__path__", None)
    if isinstance(path, list) and str(portion) not in path:
        path.append(str(portion))


# ---------------------------------------------------------------------------- installing a packed site
def find_site(folder: Path) -> tuple[str, list[Path]] | None:
    """The packed site for this Python in ``folder``: its name and pieces (or the whole archive); None if none.

    A site for another Python only is an error (its extension modules would not load here).
    """
    names = {n for n in piece_names(folder) if SITE.fullmatch(n)}
    names |= {p.name for p in folder.glob("site-py*.tar.xz") if SITE.fullmatch(p.name) and p.is_file()}
    if not names:
        return None
    mine = f"site-py{sys.version_info[0]}{sys.version_info[1]}.tar.xz"
    if mine not in names:
        raise RuntimeError(f"{folder}: {', '.join(sorted(names))} is for another Python than this "
                           f"{sys.version_info[0]}.{sys.version_info[1]} ({sys.executable})")
    whole = folder / mine
    return mine, ([whole] if whole.is_file() and not any(n == mine for n in piece_names(folder))
                  else pieces_of(folder, mine))


def unpack_site(pieces: Sequence[Path], target: Path, *, only: str | None = None) -> int:
    """Unpack the xz tar read from ``pieces`` (in order) into ``target``; return the files written.

    Streamed, so nothing is joined on disk; xz's checks find a corrupt or short archive. With ``only``,
    the members under that top folder alone (:func:`pack_site` writes ``feedfast-ext/`` first, so the
    read stops after it).
    """
    target.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    count, seen = 0, False
    with _Joined(pieces) as raw, io.BufferedReader(raw, 1 << 20) as buffered, \
            tarfile.open(fileobj=buffered, mode="r|xz") as tar:
        for member in tar:
            if only is not None:
                inside = member.name == only or member.name.startswith(only + "/")
                if not inside:
                    if seen:
                        break
                    continue
                seen = True
            tar.extract(member, target, **extra)
            count += member.isfile()
    return count


def install_site(name: str, pieces: Sequence[Path], target: Path, *, only: str | None = None) -> str:
    """Unpack the site into ``target`` once per archive (the stamp records which: name, size, a digest of its
    ends); say how."""
    stamp = target / STAMP
    want = f"{name} {sum(p.stat().st_size for p in pieces)} bytes {_ends_digest(pieces)}\n"
    if stamp.exists() and stamp.read_text(encoding="utf-8") == want:
        return f"{name} already unpacked in {target}"
    if only is None and stamp.exists():
        stamp.unlink()
    files = unpack_site(pieces, target, only=only)
    if only is None:
        stamp.write_text(want, encoding="utf-8")
    what = f"{only}/ of " if only else ""
    return f"unpacked {files} files ({what}{name}, {len(pieces)} pieces) into {target}"


def _ends_digest(pieces: Sequence[Path]) -> str:
    """A digest of the archive's first and last MiB: another build of the same size differs there (its
    ``feedfast-ext/`` comes first, xz's index last)."""
    digest = hashlib.sha256()
    with pieces[0].open("rb") as first:
        digest.update(first.read(1 << 20))
    with pieces[-1].open("rb") as last:
        last.seek(max(0, pieces[-1].stat().st_size - (1 << 20)))
        digest.update(last.read())
    return digest.hexdigest()[:16]


def source_hashes(repo: Path | None = None) -> str:
    """``sha256  path`` of every C source of feedfast's extensions, one a line (``feedfast/*.c``, ``*.h``)."""
    repo = repo or REPO
    paths = sorted(p for pattern in ("*.c", "*.h") for p in (repo / "feedfast").glob(pattern))
    return "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(repo).as_posix()}\n" for p in paths)


def install_extensions(ext_dir: Path, package: Path | None = None) -> str:
    """Copy the built extensions and their libjpeg from ``ext_dir`` into ``package`` (the checkout's
    ``feedfast/``); say what.

    Only when this checkout's C sources are the ones they were built from (``ext_dir/SOURCES``).
    """
    package = package or REPO / "feedfast"
    if not ext_dir.is_dir():
        raise RuntimeError(f"no {ext_dir}: the site holds no C extensions (made by an older make gpu-wheels?)")
    built = (ext_dir / "SOURCES").read_text(encoding="utf-8")
    here = source_hashes(package.parent)
    if built != here:
        changed = sorted(set(built.splitlines()) ^ set(here.splitlines()))
        names = sorted({line.split("  ", 1)[-1] for line in changed})
        raise RuntimeError(f"feedfast's C extensions in {ext_dir} were built from other C sources than this "
                           f"checkout's ({', '.join(names)}): make gpu-wheels again from this checkout")
    copied = []
    for src in sorted(ext_dir.iterdir()):
        if src.name == "SOURCES" or not src.is_file():
            continue
        dest = package / src.name
        if dest.exists() and dest.read_bytes() == src.read_bytes():
            continue
        part = dest.with_name(dest.name + ".part")
        shutil.copy2(src, part)
        os.replace(part, dest)
        copied.append(src.name)
    if not copied:
        return f"feedfast's C extensions already in {package}"
    return f"copied {', '.join(copied)} into {package}"


def extensions_missing(package: Path | None = None) -> list[str]:
    """The extensions with no file for this Python in ``package`` (looked for, not imported: an import
    that fails can leave feedfast's modules without them for the whole run)."""
    package = package or REPO / "feedfast"
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return [name for name in EXTENSIONS
            if not any((package / (name.rsplit(".", 1)[1] + s)).is_file() for s in suffixes)]


def setup_section(ctx: Context, sec: Section) -> None:
    """Make DALI, the loaders' modules and feedfast's C extensions importable, from the pieces when needed."""
    missing = probe(REQUIRED)
    problems: list[str] = []
    ext_from = None
    if (missing or extensions_missing()) and ctx.wheels is not None:
        folder = ctx.wheels.resolve()
        if not folder.is_dir():
            raise RuntimeError(f"--wheels {folder}: not a folder")
        target = (ctx.target or folder / f"site-py{sys.version_info[0]}{sys.version_info[1]}").resolve()
        sec.data["target"] = str(target)
        if missing:
            say(f"missing: {', '.join(f'{k} ({v})' for k, v in missing.items())}")
        site = find_site(folder)
        if site is not None:
            name, pieces = site
            how = install_site(name, pieces, target, only=None if missing else EXT_DIR)
            say(how)
            sec.data["installed"] = how
            activate(target)
            missing = probe(REQUIRED)
            try:
                how = install_extensions(target / EXT_DIR)
                say(how)
                sec.data["extensions"] = how
                ext_from = "from make gpu-wheels"
            except (OSError, RuntimeError) as exc:
                problems.append(one_line(exc))
        elif missing:
            missing = install_from_wheels(ctx, sec, folder, target)
    if "installed" in sec.data:
        sec.add("wheels", None, "", sec.data["installed"])
    if "extensions" in sec.data:
        sec.add("C extensions", None, "", sec.data["extensions"])
    report_modules(sec, missing)
    if not missing:
        problems += report_extensions(sec, ext_from)
    if missing:
        hint = "" if ctx.wheels else "; pass --wheels DIR (or WHEELS=DIR) holding the pieces (make gpu-wheels)"
        problems.insert(0, f"not importable: {', '.join(missing)}{hint}")
    if problems:
        raise RuntimeError("; ".join(problems))


def install_from_wheels(ctx: Context, sec: Section, folder: Path, target: Path) -> dict[str, str]:
    """The older form: reuse ``target``, else join wheel pieces and install every wheel; what is still missing."""
    if (target / STAMP).exists():
        activate(target)
        sec.data["installed"] = f"reused what an earlier run installed in {target}"
        say(sec.data["installed"])
        if not (missing := probe(REQUIRED)):
            return missing
    for line in join_pieces(folder):
        say(line)
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"no site-py*.tar.xz pieces, .whl files or NAME.part-* pieces in {folder}")
    how = install_wheels(wheels, target, timeout=max(30.0, ctx.budget.seconds - ctx.budget.elapsed()))
    say(how)
    sec.data["installed"] = how
    activate(target)
    return probe(REQUIRED)


def report_modules(sec: Section, missing: dict[str, str]) -> None:
    """One row per required module: its version and where it comes from, or why it failed."""
    installed = sec.data.get("target")
    for name in REQUIRED:
        if name in missing:
            sec.add(f"import {name}", None, "", f"failed: {missing[name]}")
            continue
        module = sys.modules[name]
        where = str(Path(getattr(module, "__file__", "") or "?").parent)
        origin = "from the wheels" if installed and where.startswith(installed) else "present"
        sec.add(f"import {name}", str(getattr(module, "__version__", "?")), "", f"{origin}: {where}")


def report_extensions(sec: Section, ext_from: str | None) -> list[str]:
    """One row per C extension; the problems: one that fails to import after the site brought it."""
    problems = []
    for name in EXTENSIONS:
        failed = probe([name])
        if not failed:
            where = Path(sys.modules[name].__file__ or "?").name
            sec.add(f"import {name}", None, "", f"{ext_from or 'present'}: {where}")
        elif ext_from:
            sec.add(f"import {name}", None, "", f"failed: {failed[name]}")
            problems.append(f"{name} not importable: {failed[name]}")
        else:
            sec.add(f"import {name}", None, "", f"absent (optional; Pillow/NumPy run its steps): {failed[name]}")
    return problems


# ---------------------------------------------------------------------------- making the pieces
def download(dest: Path, *, python: str, packages: Sequence[str] = PACKAGES) -> list[Path]:
    """``pip download`` the wheels of ``packages`` for CPython ``python`` on manylinux x86_64 into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [a for tag in PLATFORMS for a in ("--platform", tag)]
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps", "--python-version", python,
           "--implementation", "cp", *platforms, "--dest", str(dest), *packages]
    say(" ".join(cmd))
    subprocess.run(cmd, check=True)
    return sorted(dest.glob("*.whl"))


def pack(wheels: Sequence[Path], out: Path, *, piece_bytes: int = PIECE_BYTES) -> list[Path]:
    """Tar ``wheels`` and cut the tar into ``out/wheels.tar.part-aa``, ``-ab``, ... (what :func:`join_pieces` joins)."""
    if not wheels:
        raise ValueError("no wheels to pack")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("wheels.tar.part-*"):
        old.unlink()
    archive = out / "wheels.tar"
    with tarfile.open(archive, "w") as tar:
        for wheel in wheels:
            tar.add(wheel, arcname=wheel.name)
    pieces = []
    with archive.open("rb") as src:
        for index in range(26 * 26):
            chunk = src.read(piece_bytes)
            if not chunk:
                break
            piece = out / f"wheels.tar.part-{_letters(index)}"
            piece.write_bytes(chunk)
            pieces.append(piece)
        if src.read(1):
            raise ValueError(f"more than {26 * 26} pieces of {piece_bytes} bytes")
    archive.unlink()
    return pieces


def build_site(wheels: Sequence[Path], site: Path, *, python: str) -> None:
    """Install ``wheels`` for CPython ``python`` (manylinux x86_64) into a new folder ``site``."""
    if not wheels:
        raise ValueError("no wheels to install")
    if site.exists():
        shutil.rmtree(site)
    platforms = [a for tag in PLATFORMS for a in ("--platform", tag)]
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
           "--disable-pip-version-check", "--target", str(site), "--python-version", python, "--implementation", "cp",
           "--only-binary=:all:", *platforms, *map(str, wheels)]
    say(f"pip install --target {site} --python-version {python} {len(wheels)} wheels")
    subprocess.run(cmd, check=True, timeout=1800)


def prune(site: Path, *, python: str) -> tuple[int, int]:
    """Drop what Python ``python`` on the GPU machine never loads from ``site``; return (paths, bytes) dropped.

    Other Pythons' extension modules (``*.cpython-313-*.so``, ``*.cpython-314t-*.so``, ...),
    ``__pycache__`` and ``tests`` folders, and :data:`UNUSED`.
    """
    mine = python.replace(".", "")
    abi = re.compile(r"\.cpython-(\d+)(t?)-[^/]*\.so$")
    drop: list[Path] = [site / rel for rel in UNUSED if (site / rel).exists()]
    for path in site.rglob("*"):
        if path.is_dir() and path.name in ("__pycache__", "tests"):
            drop.append(path)
        elif path.is_file() and (m := abi.search(path.name)) and (m[1], m[2]) != (mine, ""):
            drop.append(path)
    count = size = 0
    for path in sorted(set(drop), key=lambda p: len(p.parts)):
        if not path.exists() and not path.is_symlink():
            continue  # inside a folder dropped already
        if path.is_dir():
            size += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        else:
            size += path.stat().st_size
            path.unlink()
        count += 1
    return count, size


def find_python(version: str, given: str | None = None) -> str:
    """A CPython ``version`` interpreter: ``given``, else ``pythonX.Y`` on the PATH, else pyenv's newest."""
    if given:
        candidates = [given]
    else:
        pyenv = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
        candidates = [c for c in [shutil.which(f"python{version}")] if c]
        candidates += sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}"), reverse=True)
    for candidate in candidates:
        proc = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, check=False)
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return candidate
    raise RuntimeError(f"no Python {version} to build feedfast's C extensions with (tried {candidates or 'none'}): "
                       "pass --build-python")


def with_setuptools(python: str, work: Path) -> str:
    """``python`` if it imports setuptools, else a venv of it in ``work`` with setuptools installed."""
    if subprocess.run([python, "-c", "import setuptools"], capture_output=True, check=False).returncode == 0:
        return python
    venv = work / "build-venv"
    exe = venv / "bin" / "python"
    if not exe.exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    if subprocess.run([str(exe), "-c", "import setuptools"], capture_output=True, check=False).returncode != 0:
        subprocess.run([str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check", "setuptools"],
                       check=True, timeout=600)
    return str(exe)


def linked(library: Path, prefix: str) -> dict[str, Path]:
    """The libraries ``library`` loads whose names start with ``prefix``, as ``ldd`` resolves them."""
    out = subprocess.run(["ldd", str(library)], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].startswith(prefix) and parts[1] == "=>":
            if parts[2] == "not":
                raise RuntimeError(f"{library}: {parts[0]} not found")
            found[parts[0]] = Path(parts[2])
    return found


def build_extensions(python: str, dest: Path, work: Path) -> list[Path]:
    """Build feedfast's C extensions with ``python`` (rpath ``$ORIGIN``) into ``dest`` with their libjpeg.

    Every one must build (``setup.py`` calls them optional: a failure there is quiet). Checked: the
    rpath is set, ``ldd`` resolves libjpeg beside them, and ``python`` imports all three from ``dest``.
    """
    lib, temp = work / "ext-lib", work / "ext-temp"
    for path in (lib, temp, dest):
        if path.exists():
            shutil.rmtree(path)
    # the interpreter's own link line can carry an rpath of its build (pyenv's lib folder): left out
    ldshared = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('LDSHARED'))"],
                              capture_output=True, text=True, check=True).stdout.split()
    env = {**os.environ, "LDSHARED": " ".join(a for a in ldshared if not a.startswith("-Wl,-rpath")),
           "LDFLAGS": f"{os.environ.get('LDFLAGS', '')} -Wl,-rpath,$ORIGIN".strip()}
    env.pop("LD_LIBRARY_PATH", None)
    cmd = [python, "setup.py", "build_ext", "--build-lib", str(lib), "--build-temp", str(temp)]
    say(f"LDSHARED='{env['LDSHARED']}' LDFLAGS='{env['LDFLAGS']}' {' '.join(cmd)}")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    built = {name: sorted((lib / "feedfast").glob(name.rsplit(".", 1)[1] + ".cpython-*.so")) for name in EXTENSIONS}
    if proc.returncode != 0 or not all(built.values()):
        log = (proc.stderr + proc.stdout).strip().splitlines()
        failed = [name for name, paths in built.items() if not paths]
        raise RuntimeError(f"building {', '.join(failed) or 'the extensions'} failed ({proc.returncode}): "
                           + " | ".join(line for line in log if "error" in line.lower())[-2000:])
    dest.mkdir(parents=True)
    files = [Path(shutil.copy2(paths[0], dest / paths[0].name)) for paths in built.values()]
    libs: dict[str, Path] = {}
    for so in files:
        libs.update(linked(so, "libjpeg"))
    for soname, path in sorted(libs.items()):
        files.append(Path(shutil.copyfile(path.resolve(), dest / soname)))
    (dest / "SOURCES").write_text(source_hashes(), encoding="utf-8")
    check_extensions(python, dest, [so for so in files if ".cpython-" in so.name], sorted(libs))
    return files


def check_extensions(python: str, dest: Path, modules: Sequence[Path], libs: Iterable[str]) -> None:
    """Each module's rpath is ``$ORIGIN`` and ``ldd`` finds those of ``libs`` it links in ``dest``; ``python``
    imports them all."""
    for so in modules:
        if shutil.which("readelf"):
            dynamic = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
            paths = re.findall(r"\((?:RUNPATH|RPATH)\)[^[]*\[([^]]*)\]", dynamic)
            if paths != ["$ORIGIN"]:
                raise RuntimeError(f"{so}: RUNPATH/RPATH {paths}, not just $ORIGIN")
        for soname in libs:
            where = linked(so, soname).get(soname)
            if where is not None and where.parent.resolve() != dest.resolve():
                raise RuntimeError(f"{so}: ldd finds {soname} at {where}, not beside it")
    code = ("import importlib.util, sys\n"
            "for path in sys.argv[1:]:\n"
            "    name = 'feedfast.' + path.rsplit('/', 1)[1].split('.', 1)[0]\n"
            "    spec = importlib.util.spec_from_file_location(name, path)\n"
            "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    subprocess.run([python, "-I", "-c", code, *map(str, modules)], env=env, check=True, timeout=60)


def _tar_site(site: Path, sink: IO[bytes]) -> None:
    """Write ``site`` as a tar stream to ``sink``: ``feedfast-ext/`` first, then the rest by name, owner root."""
    def owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    tops = sorted(site.iterdir(), key=lambda p: (p.name != EXT_DIR, p.name))
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for top in tops:
            tar.add(top, arcname=top.name, filter=owner)


def pack_site(site: Path, out: Path, *, name: str, piece_bytes: int = PIECE_BYTES, preset: str = "9e",
              use_xz: bool | None = None) -> list[Path]:
    """Pack ``site`` as ``name`` (a ``.tar.xz``) cut into ``out/NAME.part-1-of-N`` ... ``part-N-of-N``.

    ``preset`` is xz's: ``0`` to ``9``, ``e`` for extreme (``9e``). The ``xz`` command (all cores, blocks of
    256 MiB: little lost to the cut) when present and ``use_xz`` is not False, else Python's lzma (one
    core). The archive is cut into the fewest pieces of at most ``piece_bytes``, of even size.
    """
    if not re.fullmatch(r"[0-9]e?", preset):
        raise ValueError(f"xz preset {preset!r}: 0 to 9, e for extreme (9e)")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{glob.escape(name)}.part-*"):
        old.unlink()
    xz = shutil.which("xz") if use_xz is not False else None
    if use_xz and xz is None:
        raise RuntimeError("no xz command")
    whole = out / f".{name}.partial"
    try:
        with whole.open("wb") as sink:
            if xz:
                _pack_with_xz(xz, site, sink, preset)
            else:
                level = int(preset[0]) | (lzma.PRESET_EXTREME if preset.endswith("e") else 0)
                with lzma.LZMAFile(sink, "wb", preset=level) as compressed:
                    _tar_site(site, compressed)  # type: ignore[arg-type]
        return cut(whole, out, name=name, piece_bytes=piece_bytes)
    finally:
        whole.unlink(missing_ok=True)


def cut(whole: Path, out: Path, *, name: str, piece_bytes: int) -> list[Path]:
    """Cut ``whole`` into ``out/NAME.part-K-of-N``: the fewest pieces of at most ``piece_bytes``, of even size."""
    size = whole.stat().st_size
    total = max(1, -(-size // piece_bytes))
    step = -(-size // total)
    pieces = []
    with whole.open("rb") as src:
        for index in range(1, total + 1):
            piece = out / f"{name}.part-{index}-of-{total}"
            with piece.open("wb") as dest:
                left = step
                while left and (chunk := src.read(min(left, 1 << 24))):
                    dest.write(chunk)
                    left -= len(chunk)
            pieces.append(piece)
    return pieces


def _pack_with_xz(xz: str, site: Path, sink: IO[bytes], preset: str) -> None:
    """Tar ``site`` through an ``xz -PRESET -T0`` process into ``sink``."""
    proc = subprocess.Popen([xz, f"-{preset}", "-T0", "--block-size=256MiB", "-c"], stdin=subprocess.PIPE,
                            stdout=sink)
    assert proc.stdin is not None
    try:
        with proc.stdin as feed:
            _tar_site(site, feed)
    finally:
        if proc.wait() != 0:
            raise RuntimeError(f"xz -{preset} failed ({proc.returncode})")


def main(argv: Sequence[str] | None = None) -> int:
    """Download (or take) the wheels, make the site and its pieces; say what to copy and run."""
    p = argparse.ArgumentParser(description="Pieces of under 58 MB for gpu_check.py on a GPU machine without "
                                            "network: DALI's wheels installed for its Python, with feedfast's C "
                                            "extensions (run this where pip can download).")
    p.add_argument("--out", type=Path, required=True, help="folder for the pieces (the work goes in OUT/build)")
    p.add_argument("--from", dest="source", type=Path, default=None, help="take the wheels of this folder instead")
    p.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    p.add_argument("--build-python", default=None,
                   help="that Python here, to build feedfast's C extensions (default: pythonX.Y on PATH, else pyenv's)")
    p.add_argument("--preset", default="9e", help="xz preset: 0-9, e for extreme (default 9e; 8 is faster, larger)")
    p.add_argument("--piece-bytes", type=int, default=PIECE_BYTES, help=f"largest piece (default {PIECE_BYTES})")
    p.add_argument("--wheels-only", action="store_true",
                   help="the older form: the wheels in wheels.tar.part-aa ... pieces, without the C extensions")
    args = p.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python):
        p.error(f"--python {args.python!r}: major.minor, e.g. 3.12")
    work = args.out / "build"
    wheels = sorted(args.source.glob("*.whl")) if args.source else download(work / "download", python=args.python)
    name = f"site-py{args.python.replace('.', '')}.tar.xz"
    if args.wheels_only:
        for old in args.out.glob("site-py*.tar.xz.part-*"):
            old.unlink()
        pieces = pack(wheels, args.out, piece_bytes=args.piece_bytes)
    else:
        python = with_setuptools(find_python(args.python, args.build_python), work)
        site = work / "site"
        build_site(wheels, site, python=args.python)
        count, size = prune(site, python=args.python)
        say(f"dropped {count} files and folders the GPU machine never loads ({size / 2**20:.0f} MiB)")
        built = build_extensions(python, site / EXT_DIR, work)
        say(f"built {', '.join(f.name for f in built)} into {site / EXT_DIR}")
        unpacked = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
        say(f"packing {unpacked / 2**20:.0f} MiB with xz -{args.preset} (minutes: 3.5 for 504 MiB on 2 cores)")
        for old in args.out.glob("wheels.tar.part-*"):
            old.unlink()
        pieces = pack_site(site, args.out, name=name, piece_bytes=args.piece_bytes, preset=args.preset)
    total = sum(piece.stat().st_size for piece in pieces)
    print(f"{len(wheels)} wheels in {len(pieces)} pieces ({total:,} bytes, {total / 1e6:.0f} MB) in {args.out}:")
    for piece in pieces:
        print(f"  {piece.name}  {piece.stat().st_size:,} bytes")
    print(f"copy these {len(pieces)} files into one folder on the GPU machine (nothing else), then, in the "
          "checkout there: make gpu-check WHEELS=that-folder")
    return 0


if __name__ == "__main__":
    sys.exit(main())
