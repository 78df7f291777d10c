"""``tuiwatch ls``: the live runs on this host."""

from __future__ import annotations

import argparse
from typing import Any

from tuiwatch.analysis.format import json_text, safe
from tuiwatch.wire.discovery import LiveJob, LiveRun, as_dicts, group_jobs, list_live_runs


def add_parser(sub: Any) -> None:
    from tuiwatch.cli.attach import add_remote_options

    p = sub.add_parser(
        "ls",
        help="list live runs on this host (or host:)",
        description="List the live runs on this host, or on another with HOST: (through ssh). The ranks of "
        "one job (torchrun) are one row; --json lists each rank.",
    )
    p.add_argument("host", nargs="?", metavar="HOST:", help="[user@]host: to list the runs of another host")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    add_remote_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tuiwatch.errors import TuiwatchError
    from tuiwatch.wire.discovery import list_remote_runs, parse_remote

    if args.host is not None:
        remote = parse_remote(args.host if args.host.endswith(":") else f"{args.host}:", args.ssh, args.remote_tuiwatch)
        if remote is None or remote.name is not None:
            raise TuiwatchError(f"ls takes a host as HOST: (got {args.host!r})")
        runs = list_remote_runs(remote)
    else:
        runs = list_live_runs()
    if args.json:
        print(json_text(as_dicts(runs)))
        return 0
    if not runs:
        print("no live runs (start one with: tuiwatch demo)")
        return 0
    rows = [("NAME", "PID", "STEP", "STATUS", "SOCKET")]
    rows += [_row(found) for found in group_jobs(runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
    return 0


def _row(found: LiveRun | LiveJob) -> tuple[str, str, str, str, str]:
    # Names, statuses and paths come from other processes' files: shown literally (no escape reaches the terminal).
    step = "-" if found.step is None else str(found.step)
    if isinstance(found, LiveRun):
        return safe(found.name, 80), str(found.pid), step, safe(found.status, 20), safe(found.socket, 300)
    ranks = found.ranks
    more = f" (+{len(ranks) - 1} more)" if len(ranks) > 1 else ""
    return (
        safe(found.name, 80),
        ",".join(str(r.pid) for r in ranks[:4]) + (",..." if len(ranks) > 4 else ""),
        step,
        f"{safe(found.status, 20)}, ranks {len(ranks)}/{found.world_size}",
        safe(ranks[0].socket, 300) + more,
    )
