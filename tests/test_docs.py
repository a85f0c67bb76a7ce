"""The pages under docs/ hold what they show: their specs validate, their Python runs, their links resolve.

A page's fenced blocks, by the fence's info string:

- ```yaml: a whole spec (it has ``pipeline``) is validated as it stands; a fragment (``decoder: ...``)
  is validated merged into the tests' small spec.
- ```python: executed, each block on its own, with the globals the README's snippets get (``feedfast``,
  ``loader``, ``train_step``, ``spec``, ``shards``). A block that cannot run on a CPU machine without
  the network (it needs a GPU, Accelerate, Lightning, a real dataset) says so in its fence,
  ```python no-run, and its test is reported as skipped, not passed.
- ```bash, ```text, ```diff and bare fences are shown, not run.

The README's own snippets are tested in ``tests/test_readme.py``; the links of the README,
BENCHMARKS.md and every page are checked here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

import feedfast
from feedfast.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *DOCS]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", flags=re.S | re.M)
SHOWN = {"", "bash", "text", "diff"}
RUN = {"python", "yaml"}


class Block(NamedTuple):
    page: Path
    line: int
    lang: str
    flags: tuple[str, ...]
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        lang, *flags = match.group(1).split() or [""]
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, lang, tuple(flags), match.group(2)))
    return found


def _of(lang: str) -> list[Block]:
    return [b for page in DOCS for b in blocks(page) if b.lang == lang]


def _ids(found: list[Block]) -> list[str]:
    return [b.where for b in found]


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_fences_are_known(page: Path) -> None:
    for block in blocks(page):
        assert block.lang in SHOWN | RUN, f"{block.where}: unknown fence language {block.lang!r}"
        assert block.flags in ((), ("no-run",)) and not (block.flags and block.lang != "python"), \
            f"{block.where}: unknown fence flags {block.flags}: only ```python no-run"


@pytest.mark.parametrize("block", _of("yaml"), ids=_ids(_of("yaml")))
def test_yaml_blocks_validate(block: Block, small_spec: dict) -> None:
    data = yaml.safe_load(block.code)
    assert isinstance(data, dict), f"{block.where}: not a mapping"
    load_spec(data if "pipeline" in data else {**small_spec, **data})


def test_the_spec_page_shows_imagenet_train() -> None:
    (spec_block,) = [b for b in _of("yaml") if b.page.name == "spec.md"]
    spec = load_spec(yaml.safe_load(spec_block.code))
    assert spec.outputs == ("image", "label") and spec.fields["image"].ops[1].op == "random_resized_crop"


@pytest.mark.parametrize("block", _of("python"), ids=_ids(_of("python")))
def test_python_blocks_run(block: Block, small_spec: dict, shards: list[str], tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    if "no-run" in block.flags:
        pytest.skip(f"{block.where} is marked no-run: it needs what this machine lacks (GPU, Accelerate, Lightning)")
    monkeypatch.chdir(tmp_path)  # from outside the repository, as a user runs them
    loader = feedfast.DataLoader(small_spec, shards=shards, num_workers=1, shuffle=True)
    seen: list[object] = []
    names = {"feedfast": feedfast, "loader": loader, "train_step": seen.append, "print": lambda *a: None,
             "spec": small_spec, "shards": shards}
    try:
        exec(compile(block.code, block.where, "exec"), names)
    finally:
        for value in {id(v): v for v in [loader, *names.values()]}.values():
            if isinstance(value, feedfast.DataLoader):
                value.close()
    if "train_step(" in block.code:
        assert seen, f"{block.where} calls train_step but trained on nothing"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base, n = slug(heading), 0
        while (name := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(name)
    return found


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(ROOT)}: link to {target}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.relative_to(ROOT)}: link to {target}: no such heading"


def test_slug_follows_github() -> None:
    assert slug("In other people's training scripts") == "in-other-peoples-training-scripts"
    assert slug("GPU: feedfast against hand-written DALI (one H200, 2026-12-04)") \
        == "gpu-feedfast-against-hand-written-dali-one-h200-2026-12-04"
    assert slug("Autotune (benchmarks/tune.py), 2026-11-30") == "autotune-benchmarkstunepy-2026-11-30"
    assert slug("An unchanged job: `feedfast watch`") == "an-unchanged-job-feedfast-watch"
