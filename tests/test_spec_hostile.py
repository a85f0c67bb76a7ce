"""Specs are data: a YAML alias bomb or an alias loop is refused in well under a second, wherever it sits; a key
given twice is refused naming both lines."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from feedfast.errors import SpecError
from feedfast.spec import load_spec
from feedfast.spec.load import MAX_SPEC_VALUES
from tests.helpers import SMALL_SPEC


def _bomb(levels: int = 9, width: int = 9) -> str:
    """A YAML flow value that expands to ``width ** levels`` strings (9 ** 9: 387 million) from a few hundred bytes."""
    lines = ['{a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return ", ".join(lines) + "}"


@pytest.mark.parametrize("where", ["name", "seed", "device", "decoder", "outputs"])
def test_an_alias_bomb_is_refused_fast_naming_its_key(tmp_path: Path, where: str) -> None:
    path = tmp_path / "bomb.yaml"
    spec = copy.deepcopy(SMALL_SPEC)
    spec.pop(where, None)
    import yaml

    path.write_text(yaml.safe_dump(spec) + f"{where}: {_bomb(levels=6)}\n")
    t0 = time.monotonic()
    with pytest.raises(SpecError, match="too large once its YAML aliases are expanded") as info:
        load_spec(path)
    assert time.monotonic() - t0 < 1.0
    assert info.value.key == where and info.value.file == str(path)
    assert len(str(info.value)) < 1000


def test_an_alias_bomb_in_a_pipeline_op_and_an_alias_loop(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(textwrap.dedent(f"""\
        pipeline:
          image: [decode, {{resize: {{size: {_bomb(levels=6)}}}}}]
          label: [label]
        outputs: [image, label]
        """))
    with pytest.raises(SpecError, match="too large") as info:
        load_spec(path)
    assert info.value.key == "pipeline"
    path.write_text("name: &loop [*loop]\npipeline: {label: [label]}\noutputs: [label]\n")
    with pytest.raises(SpecError, match="too large"):
        load_spec(path)


def test_an_alias_bomb_in_an_override_or_a_dict_is_refused() -> None:
    with pytest.raises(SpecError, match="too large"):
        load_spec(SMALL_SPEC, overrides=[f"name={_bomb(levels=6)}"])
    shared: list = ["x"] * 10
    for _ in range(6):
        shared = [shared] * 10  # a million leaves, sharing one list per level
    with pytest.raises(SpecError, match="too large"):
        load_spec({**SMALL_SPEC, "name": shared})


def test_small_aliases_and_long_names_still_load(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text("name: " + "n" * 10_000 + "\npipeline:\n  image: [decode, {resize: {size: &s 32}}, "
                    "{center_crop: {size: *s}}]\n  label: [label]\noutputs: [image, label]\n")
    assert [call.params["size"] for call in load_spec(path).fields["image"].ops[1:]] == [32, 32]
    assert load_spec({**SMALL_SPEC, "name": "n" * 10_000}).name == "n" * 10_000
    assert MAX_SPEC_VALUES >= 10_000


def test_the_full_bomb_under_name_is_refused_in_under_a_second_in_bounded_memory(tmp_path: Path) -> None:
    """The reported case: 9 ** 9 strings; before, the error message's repr ran past 120 s and 4.7 GB."""
    path = tmp_path / "bomb.yaml"
    path.write_text(f"version: 1\nname: {_bomb()}\npipeline: {{label: [label]}}\noutputs: [label]\n")
    code = textwrap.dedent(f"""\
        import resource, sys, time
        from feedfast.errors import SpecError
        from feedfast.spec import load_spec
        # 2 GiB of address space beyond what the imports mapped (a CUDA build of torch maps several GiB it never
        # touches), where the unbounded repr took 4.7 GB
        mapped = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) << 10
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (2 << 30), mapped + (2 << 30)))
        t0 = time.monotonic()
        try:
            load_spec({str(path)!r})
        except SpecError as exc:
            print(round(time.monotonic() - t0, 3), "too large" in str(exc))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert len(done.stdout.split()) == 2, done.stderr[-2000:]
    seconds, named = done.stdout.split()
    assert named == "True" and float(seconds) < 1.0, done.stderr[-2000:]


@pytest.mark.parametrize(("text", "key", "lines"), [
    ("seed: 1\npipeline:\n  image: [decode]\n  label: [label]\noutputs: [image, label]\nseed: 2\n", "seed", (1, 6)),
    ("pipeline:\n  image:\n    - decode\n    - resize:\n        size: 32\n        size: 48\n  label: [label]\n"
     "outputs: [image, label]\n", "pipeline.image[1].resize.size", (5, 6)),
    ("pipeline: {image: [decode], label: [label], image: [decode]}\noutputs: [image, label]\n", "pipeline.image",
     (1, 1)),
])
def test_a_key_given_twice_is_refused_naming_its_path_and_both_lines(tmp_path: Path, text: str, key: str,
                                                                      lines: tuple[int, int]) -> None:
    """YAML keeps the last of two equal keys silently; a spec refuses them, as TOML does."""
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=f"given twice, on lines {lines[0]} and {lines[1]}") as info:
        load_spec(path)
    assert info.value.key == key and info.value.file == str(path) and "\n" not in str(info.value)


def test_equal_keys_in_different_mappings_or_of_different_types_still_load(tmp_path: Path) -> None:
    path = tmp_path / "fine.yaml"
    path.write_text("name: {1: a, '1': b}\npipeline:\n  image: [decode, {resize: {size: &s 32}}, "
                    "{center_crop: {size: *s}}]\n  label: [label]\noutputs: [image, label]\n")
    with pytest.raises(SpecError, match="name") as info:  # name must be a string; the mapping itself was read
        load_spec(path)
    assert "twice" not in str(info.value)
    path.write_text("pipeline:\n  image: [decode, {resize: {size: 32}}, {center_crop: {size: 32}}]\n"
                    "  label: [label]\noutputs: [image, label]\n")
    assert [call.params["size"] for call in load_spec(path).fields["image"].ops[1:]] == [32, 32]
