"""``tuiwatch attach [TARGET]``: the live viewer. Never imports torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "attach",
        help="watch a live run in the terminal",
        description="Open the viewer on a live run of this host. TARGET: a run name, a pid, or a socket path; "
        "without it, the one live run, or a picker when there are several.",
    )
    p.add_argument("target", nargs="?", help="run name, pid or socket path")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tuiwatch.errors import TuiwatchError
    from tuiwatch.runs import LiveRun, find_socket_by_name, resolve_target

    found = resolve_target(args.target)
    if isinstance(found, list):
        from tuiwatch.viewer.picker import pick_run

        choice = pick_run(found)
        if choice is None:
            return 0
        found = choice
    assert isinstance(found, LiveRun)
    from tuiwatch.viewer.app import TuiwatchApp
    from tuiwatch.viewer.sources import SocketSource

    if not Path(found.socket).exists():
        raise TuiwatchError(f"the run {found.name} went away before the viewer started")
    TuiwatchApp(SocketSource(Path(found.socket), found.name, find_socket_by_name)).run()
    return 0
