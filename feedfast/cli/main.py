"""The ``feedfast`` command (bench, analyze, plan, shards, doctor, tune, watch).

Exit 0 on success; 2 on a user error or a sample that cannot be read (one line naming
shard, sample and reason); 1 on another failure (one line); 130 on Ctrl-C. Set
``FEEDFAST_DEBUG=1`` for the whole message and the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from feedfast.errors import FeedfastError, SampleError, UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"feedfast: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    from feedfast.cli import analyze, bench, doctor, plan, shards, tune, watch

    p = _Parser(prog="feedfast", description="Keep the GPU fed: DALI pipelines over WebDataset shards.",
                epilog="run `feedfast COMMAND --help` for examples")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    bench.add_parser(sub)
    analyze.add_parser(sub)
    plan.add_parser(sub)
    shards.add_parser(sub)
    doctor.add_parser(sub)
    tune.add_parser(sub)
    watch.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (UserError, SampleError) as exc:  # a mistake in what was given, data included
        print(f"feedfast: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("feedfast: interrupted", file=sys.stderr)
        return 130
    except FeedfastError as exc:
        print(f"feedfast: failed: {_one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the CLI's last line: report, exit 1
        if os.environ.get("FEEDFAST_DEBUG"):
            traceback.print_exc()
        print(f"feedfast: internal error: {type(exc).__name__}: {exc} (set FEEDFAST_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    """The error's first line (the whole message and the traceback with FEEDFAST_DEBUG set)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    if os.environ.get("FEEDFAST_DEBUG"):
        traceback.print_exc()
        return "\n".join(lines)
    return lines[0] + (" (set FEEDFAST_DEBUG=1 for the rest)" if len(lines) > 1 else "")


if __name__ == "__main__":
    raise SystemExit(main())
