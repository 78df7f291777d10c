"""``tuiwatch diff A B``: where two runs part. Exit 0 identical, 1 different, 2 bad input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tuiwatch.analysis.diff import FIELDS, as_text, compare
from tuiwatch.analysis.format import json_text
from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.ranks import rank_ledgers
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
    p.add_argument("a", metavar="A", help="a ledger.jsonl, a run directory, or a job directory of several ranks")
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
    jobs = rank_ledgers(args.a), rank_ledgers(args.b)
    if jobs[0] and jobs[1]:
        return _diff_jobs(jobs[0], jobs[1], args, fields)
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


def _diff_jobs(a: dict[int, Path], b: dict[int, Path], args: argparse.Namespace, fields: list[str]) -> int:
    """Two job directories: rank k against rank k, for the ranks both have; the rank that parts first leads."""
    common = sorted(set(a) & set(b))
    if not common:
        print(f"tuiwatch: error: the jobs share no rank ({sorted(a)} and {sorted(b)})", file=sys.stderr)
        return 2
    found = {
        rank: compare(
            list(read_ledger(a[rank])), list(read_ledger(b[rank])), rtol=args.rtol, atol=args.atol, fields=fields
        )
        for rank in common
    }
    differing = [r for r in common if not found[r].identical]
    # Where the job parts: the rank whose first difference comes at the earliest step.
    first = min(differing, key=lambda r: _at(found[r]), default=None)
    only = sorted(set(a) ^ set(b))
    if args.json:
        result = {"ranks": {str(r): found[r].as_dict() for r in common}, "first_rank": first, "unmatched": only}
        print(json_text(result, indent=False))
    else:
        if first is None:
            print(f"the {len(common)} ranks agree on every common step")
        for rank in [first] if first is not None else []:
            others = [r for r in differing if r != first]
            also = f" (also ranks {', '.join(map(str, others))})" if others else ""
            print(f"rank {rank} parts first{also}:")
            print(as_text(found[rank], fields))
        if only:
            print(f"ranks in one job only: {', '.join(map(str, only))}")
    return 0 if first is None and not only else 1


def _at(found: Any) -> float:
    step = found.difference.step if found.difference is not None else None
    return -1.0 if step is None else float(step)
