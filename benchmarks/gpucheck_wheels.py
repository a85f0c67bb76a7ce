"""``gpu_check.py``'s setup section (the required modules, installed from wheel pieces when missing),
and the helper that makes the pieces on a machine with network.

Making the pieces (``make gpu-wheels``, or ``python benchmarks/gpucheck_wheels.py --out DIR``):
``pip download`` fetches the wheels of :data:`PACKAGES` for the GPU machine (Python 3.12,
manylinux x86_64, DALI for CUDA 13, no dependencies resolved: the list is complete), then
:func:`pack` puts them in one ``wheels.tar`` cut into ``wheels.tar.part-aa``, ``-ab``, ... of
at most :data:`PIECE_BYTES` each (about 260 MB in all, so five pieces). Copy the pieces into
one folder on the GPU machine and run ``make gpu-check WHEELS=DIR`` (or ``python
benchmarks/gpu_check.py --wheels DIR``): the setup section joins, unpacks and installs them.
``--from DIR`` packs wheels already downloaded instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from gpucheck_common import REQUIRED, Context, Section, one_line, say

PACKAGES = (
    "nvidia-dali-cuda130", "nvidia-nvimgcodec-cu13", "nvidia-libnvcomp-cu13", "nvidia-nvjpeg",
    "astunparse", "gast", "libcst", "makefun", "nvtx", "optree", "six", "packaging",
    "webdataset", "braceexpand", "pyyaml", "psutil",
)
"""What the GPU machine lacks (it has torch, torchvision, numpy, PIL; see DALI-NOTES.md):
DALI for CUDA 13 with its libraries and pure-Python needs, and feedfast's own."""
PIECE_BYTES = 55 * 2**20
"""Largest piece: under the 60 MB (60,000,000 bytes) a transfer to the GPU machine takes."""


def probe(names: Sequence[str]) -> dict[str, str]:
    """Import each module; map the ones that fail to ``Type: message``."""
    failed: dict[str, str] = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - DALI can raise OSError/RuntimeError for a missing library
            failed[name] = one_line(exc)
    return failed


def join_pieces(folder: Path) -> list[str]:
    """Join ``NAME.part-*`` pieces into ``NAME`` (sorted order); unpack the wheels of a joined tar."""
    done: list[str] = []
    groups: dict[str, list[Path]] = {}
    for piece in sorted(folder.glob("*.part-*")):
        groups.setdefault(piece.name.split(".part-")[0], []).append(piece)
    for name, pieces in groups.items():
        whole = folder / name
        size = sum(p.stat().st_size for p in pieces)
        if not whole.exists() or whole.stat().st_size != size:
            with whole.open("wb") as out:
                for piece in pieces:
                    with piece.open("rb") as src:
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


def install_wheels(wheels: Sequence[Path], target: Path, timeout: float) -> str:
    """Install every wheel into ``target`` (once per set of wheels); say how."""
    stamp = target / ".feedfast-gpu-check"
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


def setup_section(ctx: Context, sec: Section) -> None:
    """Make DALI and the loaders' modules importable, from wheels when needed."""
    missing = probe(REQUIRED)
    if missing and ctx.wheels is not None:
        folder = ctx.wheels.resolve()
        if not folder.is_dir():
            raise RuntimeError(f"--wheels {folder}: not a folder")
        target = (ctx.target or folder / f"site-py{sys.version_info[0]}{sys.version_info[1]}").resolve()
        if (target / ".feedfast-gpu-check").exists():
            activate(target)
            missing = probe(REQUIRED)
            sec.data["installed"] = f"reused what an earlier run installed in {target}"
            say(sec.data["installed"])
        if missing:
            say(f"missing: {', '.join(f'{k} ({v})' for k, v in missing.items())}")
            for line in join_pieces(folder):
                say(line)
            wheels = sorted(folder.glob("*.whl"))
            if not wheels:
                raise RuntimeError(f"no .whl files (or NAME.part-* pieces) in {folder}")
            how = install_wheels(wheels, target, timeout=max(30.0, ctx.budget.seconds - ctx.budget.elapsed()))
            say(how)
            sec.data["installed"] = how
            activate(target)
            missing = probe(REQUIRED)
        sec.data["target"] = str(target)
    if "installed" in sec.data:
        sec.add("wheels", None, "", sec.data["installed"])
    report_modules(sec, missing)
    if missing:
        hint = "" if ctx.wheels else "; pass --wheels DIR (or WHEELS=DIR) holding the wheels (DALI-NOTES.md)"
        raise RuntimeError(f"not importable: {', '.join(missing)}{hint}")


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


# ---------------------------------------------------------------------------- making the pieces
def download(dest: Path, *, python: str, packages: Sequence[str] = PACKAGES) -> list[Path]:
    """``pip download`` the wheels of ``packages`` for CPython ``python`` on manylinux x86_64 into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [a for tag in ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")
                 for a in ("--platform", tag)]
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
            piece = out / f"wheels.tar.part-{chr(97 + index // 26)}{chr(97 + index % 26)}"
            piece.write_bytes(chunk)
            pieces.append(piece)
        if src.read(1):
            raise ValueError(f"more than {26 * 26} pieces of {piece_bytes} bytes")
    archive.unlink()
    return pieces


def main(argv: Sequence[str] | None = None) -> int:
    """Download (or take) the wheels and write the pieces; say what to do with them."""
    p = argparse.ArgumentParser(description="Wheel pieces of under 60 MB for gpu_check.py on a GPU machine "
                                            "without network (run this where pip can download).")
    p.add_argument("--out", type=Path, required=True, help="folder for the pieces")
    p.add_argument("--from", dest="source", type=Path, default=None, help="pack the wheels of this folder instead")
    p.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    args = p.parse_args(argv)
    wheels = sorted(args.source.glob("*.whl")) if args.source else download(args.out / "download", python=args.python)
    pieces = pack(wheels, args.out)
    total = sum(piece.stat().st_size for piece in pieces)
    print(f"{len(wheels)} wheels in {len(pieces)} pieces ({total / 2**20:.0f} MiB) in {args.out}")
    print("on the GPU machine, with the pieces in DIR: make gpu-check WHEELS=DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
