"""Run every fault scenario and the healthy matrix (2 models x 2 variants x 5 seeds x 1,000 steps) on the CPU,
and write the measured table into docs/rules.md between its matrix markers.

    python bench/rule_matrix.py           # print the table and update docs/rules.md
    python bench/rule_matrix.py --check   # print it; exit 1 if a fault is missed or a healthy run alerts
    python bench/rule_matrix.py --only scenarios   # one of the two tables (the other is left as it is)
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from tuiwatch.demo import style_matrix
from tuiwatch.demo.matrix import all_rows, as_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "rules.md"
START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"
STYLES_START, STYLES_END = "<!-- styles:start -->", "<!-- styles:end -->"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="do not touch the docs")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per style and schedule (default 5)")
    parser.add_argument("--only", choices=("scenarios", "styles"), help="measure one table; keep the other")
    args = parser.parse_args()
    started = time.monotonic()
    tables, bad = [], []
    if args.only != "styles":
        faults, healthy = all_rows()
        tables.append((START, END, as_markdown(faults, healthy)))
        bad += [r.run for r in faults if r.first(r.expected or "") is None] + [r.run for r in healthy if r.alerts]
    if args.only != "scenarios":
        styled, planted = style_matrix.run(range(args.seeds), progress=lambda line: print(line, file=sys.stderr))
        tables.append((STYLES_START, STYLES_END, style_matrix.as_markdown(styled, planted, args.seeds)))
        bad += [f"{h.style}/{h.schedule}/{h.seed}" for h in styled if h.alerts]
        bad += [f"{p.fault} in {p.style}" for p in planted if p.delay is None]
    for _, _, body in tables:
        print(body + "\n")
    print(f"({time.monotonic() - started:.0f} s)")
    if not args.check:
        text = DOC.read_text()
        for start, end, body in tables:
            text = re.sub(
                re.escape(start) + ".*?" + re.escape(end),
                lambda _, b=body, s=start, e=end: f"{s}\n{b}\n{e}",
                text,
                flags=re.S,
            )
        DOC.write_text(text)
    if bad:
        print(f"not as expected: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
