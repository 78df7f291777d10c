"""``tuiwatch replay PATH``: the viewer over a ledger file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuiwatch.cli.attach import add_compare_option, add_fps_option, viewer_options

if TYPE_CHECKING:
    from tuiwatch.viewer.sources import Source


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="show a finished (or growing) run from its ledger",
        description="Open the viewer on a ledger: a ledger.jsonl file, a run directory, or a job directory of "
        "several ranks (all ranks, as attach shows a live job). Read-only.",
    )
    p.add_argument("path", help="ledger.jsonl or a run directory")
    p.add_argument("--follow", action="store_true", help="keep reading as the ledger grows")
    add_fps_option(p)
    add_compare_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tuiwatch.viewer.app import TuiwatchApp

    source = replay_source(args.path, args.follow)
    return TuiwatchApp(source, **viewer_options(args)).run_viewer()


def replay_source(path: str, follow: bool = False) -> Source:
    """A ledger's source; for a job directory (``rank<k>/ledger.jsonl``), every rank's, as one job."""
    from tuiwatch.ledger.fields import integer
    from tuiwatch.ledger.ranks import rank_ledgers
    from tuiwatch.ledger.reader import read_ledger
    from tuiwatch.viewer.sources import FileSource, RanksSource

    ledgers = rank_ledgers(path)
    if not ledgers:
        return FileSource(path, follow=follow)
    first = next(iter(read_ledger(ledgers[min(ledgers)])), {})
    world = integer(first.get("world_size")) or 0
    name = str(first.get("name") or Path(path).name)
    return RanksSource.of_job_dir(ledgers, name, max(world, len(ledgers)), follow=follow)
