"""The README's examples run, it stays short, and its figures are BENCHMARKS.md's.

The pages it links to under docs/ are tested in ``tests/test_docs.py`` (their specs, their Python
snippets and every link).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import feedfast

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BENCHMARKS = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
MAX_BYTES = 12 * 1024
"""Issue 39: a newcomer's README fits on a few screens; the rest belongs in docs/."""


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_python_snippets_run(small_spec: dict, shards: list[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # from outside the repository, as a user runs them
    loader = feedfast.DataLoader(small_spec, shards=shards, num_workers=1, shuffle=True)
    seen: list[object] = []
    try:
        for code in _blocks("python"):
            exec(code, {"feedfast": feedfast, "loader": loader, "train_step": seen.append, "print": lambda *a: None,
                        "spec": small_spec, "shards": shards})
    finally:
        loader.close()
    assert len(seen) == len(loader)  # the stall-meter snippet trains one epoch


def test_readme_commands_exist() -> None:
    first = _blocks("bash")[0]
    assert README.index("```bash") < README.index("\n## "), "the two commands come first"
    assert "make demo" in first and "make test" in first
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndemo:" in makefile and "\ntest:" in makefile


def test_readme_stays_short() -> None:
    size = len(README.encode("utf-8"))
    assert size <= MAX_BYTES, f"README.md is {size:,} bytes (at most {MAX_BYTES:,}): move the detail to a page in docs/"


def test_readme_figures_are_in_benchmarks() -> None:
    """Every figure of "What runs where" (a decimal, a number with thousands commas, a ratio) is in BENCHMARKS.md."""
    section = README.split("\n## What runs where\n", 1)[1].split("\n## ", 1)[0]
    figures = set(re.findall(r"\d[\d,]*\.\d+x?|\d{1,3}(?:,\d{3})+|\d+x\b", section))
    assert figures, "no figures found: has the section been renamed?"
    missing = sorted(f for f in figures if not re.search(rf"(?<![\d.,]){re.escape(f)}(?![\d])", BENCHMARKS))
    assert not missing, f"figures in README.md's 'What runs where' that BENCHMARKS.md does not hold: {missing}"
