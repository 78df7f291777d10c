"""``tuiwatch diff A B``: where two runs part. Exit 0 identical, 1 different, 2 bad input."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tuiwatch.analysis.diff import FIELDS, as_text, compare
from tuiwatch.analysis.format import json_text
from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.reader import read_ledger


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "diff",
        help="the first step and field where two runs differ",
        description="Compare two runs: their setup (command line, seed, versions, device, model) first, then "
        "batch ids, loss, grad norm, lr and param norm on the steps both have; print the first difference and "
        "what it points to. Exit 0 when the common steps agree within tolerance, 1 when they differ or there "
        "are none, 2 on bad input.",
    )
    p.add_argument("a", metavar="A", help="a ledger.jsonl or run directory")
    p.add_argument("b", metavar="B", help="another")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance for numbers (default 0: exact)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance for numbers (default 0)")
    p.add_argument("--fields", default=",".join(FIELDS), help=f"comma-separated (default {','.join(FIELDS)})")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    fields = [f.strip() for f in args.fields.split(",") if f.strip()]
    if not fields or args.rtol < 0 or args.atol < 0:
        print("tuiwatch: error: --fields needs at least one name and tolerances must be >= 0", file=sys.stderr)
        return 2
    ledgers = []
    for path in (args.a, args.b):
        try:
            ledgers.append(list(read_ledger(path)))
        except TuiwatchError as exc:
            print(f"tuiwatch: error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(
                f"tuiwatch: error: cannot read {path}: {exc.strerror}; give a ledger.jsonl or a run directory",
                file=sys.stderr,
            )
            return 2
    a, b = ledgers
    found = compare(a, b, rtol=args.rtol, atol=args.atol, fields=fields)
    if args.json:
        print(json_text(found.as_dict(), indent=False))
    else:
        print(as_text(found, fields))
    return 0 if found.identical else 1
