"""Every command teaches: examples in its --help, a help text for every argument."""

from __future__ import annotations

import argparse

from feedfast.cli.main import parser


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
