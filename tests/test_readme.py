"""The README's examples run: its spec validates and its Python snippets execute."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import feedfast
from feedfast.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_spec_is_valid() -> None:
    (spec_text,) = _blocks("yaml")
    spec = load_spec(yaml.safe_load(spec_text))
    assert spec.outputs == ("image", "label") and spec.fields["image"].ops[1].op == "random_resized_crop"


def test_readme_python_snippets_run(small_spec: dict, shards: list[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # from outside the repository, as a user runs them
    loader = feedfast.DataLoader(small_spec, shards=shards, num_workers=1, shuffle=True)
    seen = []
    for code in _blocks("python"):
        exec(code, {"feedfast": feedfast, "loader": loader, "train_step": seen.append, "print": lambda *a: None,
                    "spec": small_spec, "shards": shards})
    assert len(seen) == 2 * len(loader)  # the tuning and stall-meter snippets each train one epoch


def test_readme_commands_exist() -> None:
    first = _blocks("bash")[0]
    assert "make demo" in first and "make test" in first
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndemo:" in makefile and "\ntest:" in makefile
