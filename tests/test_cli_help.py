"""Every command teaches: examples in its --help, a help text for every argument."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from feedfast.cli.main import parser
from tests.helpers import make_shards


def _commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    out = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out.append(((*path, name), child))
                out += _commands(child, (*path, name))
    return out


def test_every_command_has_examples_and_every_argument_a_help_text() -> None:
    commands = _commands(parser())
    assert {c[0] for c, _ in commands} >= {"bench", "analyze", "plan", "shards", "doctor"}
    missing = []
    for path, p in commands:
        leaf = not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
        if leaf and "examples:" not in (p.epilog or ""):
            missing.append(f"{' '.join(path)}: no examples")
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not a.help:
                missing.append(f"{' '.join(path)} {'/'.join(a.option_strings) or a.dest}: no help text")
    assert missing == []


def test_the_parser_and_shards_index_start_without_torch_or_dali(tmp_path: Path) -> None:
    # torch takes about 2 s to import: `feedfast --help` and `feedfast shards index` need neither it nor DALI
    shards = make_shards(tmp_path / "shards", samples=4, per_shard=2)
    code = ("import sys; import feedfast; from feedfast.cli.main import main; rc = main(['shards', 'index', "
            "*sys.argv[1:]]); print(rc, 'torch' in sys.modules, 'nvidia.dali' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *shards], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={**os.environ, "FEEDFAST_CACHE": str(tmp_path / "cache")})
    assert out.stdout.split()[-3:] == ["0", "False", "False"], out.stdout + out.stderr
    assert all(Path(s).with_suffix(".idx").exists() for s in shards)
    import feedfast

    assert feedfast.DataLoader.__module__ == "feedfast.loader.dataloader"  # still there, when first used
