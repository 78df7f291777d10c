"""The alerts the rules raise over a corpus of ledgers, one line each: for comparing two versions of the rules.

A change that should only make the rules faster must leave these lines
identical. Run it once per version over the same ledgers and compare::

    PYTHONPATH=OLD_TREE python bench/rule_identity.py OUT_A LEDGER...   # the old rules
    python bench/rule_identity.py OUT_B LEDGER...                       # the new rules
    cmp OUT_A OUT_B

A ledger argument may be a directory: every ``*.jsonl`` under it is read
(the test suite's temporary directories hold hundreds of ledgers of every
fault, style and hostile input). Each ledger's records (alerts taken out) are
fed to a fresh ``Diagnosis`` with the default rules; each alert is written
with its ledger, its record's index and every field but ``t``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from tuiwatch.ledger.codec import encode
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.rules import Diagnosis


def ledgers(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        found += sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("ledgers", nargs="+")
    args = parser.parse_args()
    rules: Counter[str] = Counter()
    records, started = 0, time.monotonic()
    with args.out.open("wb") as out:
        for path in ledgers(args.ledgers):
            try:
                stream = [r for r in read_ledger(path) if r.get("kind") != "alert"]
            except Exception as exc:  # a ledger that cannot be read is a line too: both versions must agree
                out.write(f"{path}\tunreadable {type(exc).__name__}\n".encode())
                continue
            diagnosis = Diagnosis()
            for index, record in enumerate(stream):
                for alert in diagnosis.feed(record):
                    rules[str(alert.get("rule"))] += 1
                    fields = {k: v for k, v in alert.items() if k != "t"}
                    out.write(f"{path}\t{index}\t".encode() + encode(fields))  # NaN stays "nan", not null
            records += len(stream)
    print(
        f"{records} records, {sum(rules.values())} alerts in {time.monotonic() - started:.0f} s: "
        + ", ".join(f"{rule} {n}" for rule, n in rules.most_common()),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
