"""``tuiwatch replay PATH``: the viewer over a ledger file."""

from __future__ import annotations

import argparse
from typing import Any

from tuiwatch.cli.attach import add_fps_option


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="show a finished (or growing) run from its ledger",
        description="Open the viewer on a ledger: a ledger.jsonl file or a run directory. Read-only.",
    )
    p.add_argument("path", help="ledger.jsonl or a run directory")
    p.add_argument("--follow", action="store_true", help="keep reading as the ledger grows")
    add_fps_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tuiwatch.viewer.app import TuiwatchApp
    from tuiwatch.viewer.sources import FileSource

    return TuiwatchApp(FileSource(args.path, follow=args.follow), fps=args.fps).run_viewer()
