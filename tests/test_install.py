"""Installed like any library: the built wheel carries the shipped pipelines and runs from anywhere.

The wheel is built offline the way pip builds it from an index: an sdist of a copy of the
source tree (so no build folder lands in the checkout, and MANIFEST.in is checked too), then
a wheel of that sdist. It is installed with ``--target`` into an empty folder and run from a
folder outside the repository with only that folder and the dependencies' site-packages
importable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import feedfast._pil
from feedfast.cli.common import demo_shards
from feedfast.errors import BackendError
from feedfast.spec.shipped import SOURCE
from tests.helpers import make_shards

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "feedfast", "pipelines")
SHIPPED = sorted(p.name for p in (ROOT / "pipelines").glob("*.yaml"))


def _pip(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """feedfast's wheel, built offline as pip builds it from PyPI: source tree copy, sdist, wheel."""
    work = tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        src, dst = ROOT / name, work / "src" / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    build_sdist = "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", build_sdist, str(work / "sdist")], cwd=work / "src",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    (sdist,) = (work / "sdist").glob("feedfast-*.tar.gz")
    with tarfile.open(sdist) as tar:
        assert sorted(Path(n).name for n in tar.getnames() if "/pipelines/" in n) == SHIPPED
        for source in ("_native.c", "_augment.c"):  # the extensions build from the sdist
            assert any(n.endswith(f"feedfast/{source}") for n in tar.getnames()), source
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", str(sdist), "-w", str(work / "dist"),
         cwd=work)
    (built,) = (work / "dist").glob("feedfast-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty folder with only the wheel installed into it."""
    target = tmp_path_factory.mktemp("site")
    _pip("install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel), cwd=target)
    return target


def _outside(args: list[str], *, site: Path, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """``python -m feedfast.cli.main ARGS`` run outside the repository; ``site`` and the deps only.

    ``-S`` skips site-packages' ``.pth`` files, among them the editable install's finder that
    would import feedfast from the checkout.
    """
    deps = sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=os.pathsep.join(dict.fromkeys([str(site), *deps])), FEEDFAST_CACHE=str(cache),
               PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-S", "-m", "feedfast.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def test_the_wheel_carries_the_shipped_pipelines_and_the_command(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n.removeprefix("feedfast/pipelines/") for n in names if n.startswith("feedfast/pipelines/")) \
        == SHIPPED
    assert not [n for n in names if n.startswith(("pipelines/", "tests/", "benchmarks/"))], names
    for ext in ("_native", "_augment"):
        assert [n for n in names if n.startswith(f"feedfast/{ext}.") and n.endswith(".so")], f"{ext} was not built"
    (entry,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "feedfast = feedfast.cli.main:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_wheel_says_which_pil_to_install(wheel: Path) -> None:
    (meta,) = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    assert not [r for r in base if "illow" in r], "a base PIL would overwrite pillow-simd on every upgrade"
    for extra, dist in (("pillow", "Pillow"), ("simd", "pillow-simd"), ("plot", "matplotlib")):
        assert any(r.split()[1].startswith(dist) and f'extra == "{extra}"' in r for r in requires), (extra, requires)


@pytest.mark.slow
def test_installed_wheel_plans_and_benches_by_name_outside_the_repository(installed: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert ROOT not in outside.parents
    cache = tmp_path / "cache"
    plan = _outside(["plan", "imagenet-train"], site=installed, cwd=outside, cache=cache)
    assert plan.returncode == 0, plan.stderr
    header = plan.stdout.splitlines()[0]
    assert f"{installed}/feedfast/pipelines/imagenet-train.yaml" in header, header
    assert "decoders.image_random_crop" in plan.stdout

    shards = make_shards(tmp_path / "shards", samples=8, per_shard=4)
    bench = _outside(["bench", "--shards", ",".join(shards), "--batch-size", "4", "--batches", "2", "--warmup", "0",
                      "--threads", "1", "--quiet", "--json", "-"], site=installed, cwd=outside, cache=cache)
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout)
    assert result["spec"] == str(installed / "feedfast" / "pipelines" / "imagenet-train.yaml")
    assert result["batch_size"] == 4 and result["samples_per_s"] > 0

    doctor = _outside(["doctor", "--json", "-", "--decode-seconds", "0.05"], site=installed, cwd=outside, cache=cache)
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["native"]["built"], "the installed wheel's C extension does not load"

    wrong = _outside(["plan", "imagenet-trian"], site=installed, cwd=outside, cache=cache)
    assert wrong.returncode == 2
    assert "did you mean `imagenet-train`?" in wrong.stderr
    assert all(name.removesuffix(".yaml") in wrong.stderr for name in SHIPPED), wrong.stderr


def test_the_source_checkout_reads_pipelines_in_place() -> None:
    assert SOURCE == ROOT / "pipelines"
    assert not (ROOT / "feedfast" / "pipelines").exists(), "pipelines/ is the one source of truth; no copy in feedfast/"


def test_without_pil_the_demo_names_both_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    real = feedfast._pil.importlib.util.find_spec
    monkeypatch.setattr(feedfast._pil.importlib.util, "find_spec", lambda name, *a: None if name == "PIL" else real(name, *a))
    with pytest.raises(BackendError, match="the demo dataset needs PIL") as info:
        demo_shards(quiet=True)
    assert "feedfast[pillow]" in str(info.value) and "feedfast[simd]" in str(info.value)
