"""``tuiwatch`` command line: one thin module per command, dispatched from here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from tuiwatch._version import __version__
from tuiwatch.analysis.format import safe
from tuiwatch.cli import attach, demo, diff, doctor, ls, relay, replay, report, run
from tuiwatch.errors import TuiwatchError

COMMANDS = (attach, ls, replay, report, diff, relay, doctor, demo, run)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that points to --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="tuiwatch",
        description="top for a PyTorch training run: a live per-step ledger over a private local socket.",
        epilog="In a training script: watch = tuiwatch.Watch(model, optimizer); "
        "for x, y in watch.batches(loader): ... watch.log(loss=loss)",
    )
    parser.add_argument("--version", action="version", version=f"tuiwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args))
    except TuiwatchError as exc:
        # A message may hold a run's name or a path from a ledger: shown literally, never as escapes.
        print(f"tuiwatch: error: {safe(str(exc), 1000)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
