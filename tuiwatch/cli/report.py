"""``tuiwatch report PATH``: a text summary of a ledger for logs and CI."""

from __future__ import annotations

import argparse
from typing import Any

from tuiwatch.analysis.format import json_text


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="print a summary of a run",
        description="Summarise a ledger (a ledger.jsonl file or a run directory): steps, duration, "
        "final and best loss, alerts by rule, data-wait share, peak memory. A run resumed from a checkpoint "
        "is reported from its first step, through the ledgers it resumed from.",
    )
    p.add_argument("path", help="ledger.jsonl, a run directory, or a multi-rank job's directory (rank*/ledger.jsonl)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tuiwatch.analysis.job import job_text, summarize_job
    from tuiwatch.analysis.report import as_text, summarize
    from tuiwatch.ledger.chain import read_run
    from tuiwatch.ledger.ranks import rank_ledgers

    ranks = rank_ledgers(args.path)
    if ranks:  # a multi-rank job's directory: one report of all its ranks
        job = summarize_job(ranks)
        print(json_text(job) if args.json else job_text(job))
        return 0
    chain = read_run(args.path)  # a resumed run is reported as one run, from its first step
    summary = summarize(chain.iter_records(), chain=chain)  # streamed: bounded memory, whatever the length
    if args.json:
        print(json_text(summary))  # strings from the ledger: no raw C1 control or bidi override reaches the terminal
    else:
        print(as_text(summary))
    return 0
