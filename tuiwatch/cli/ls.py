"""``tuiwatch ls``: the live runs on this host."""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from tuiwatch.runs import as_dicts, list_live_runs


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ls", help="list live runs on this host", description="List the live runs on this host.")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    runs = list_live_runs()
    if args.json:
        print(orjson.dumps(as_dicts(runs), option=orjson.OPT_INDENT_2).decode())
        return 0
    if not runs:
        print("no live runs (start one with: tuiwatch demo)")
        return 0
    rows = [("NAME", "PID", "STEP", "STATUS", "SOCKET")]
    rows += [(r.name, str(r.pid), "-" if r.step is None else str(r.step), r.status, r.socket) for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
    return 0
