"""The rule matrix of docs/rules.md: each fault scenario and each healthy run, and what the rules said.

``bench/rule_matrix.py`` runs it and rewrites the table in the docs, so the
table is always a measurement, not a claim.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuiwatch.demo.faults import FAULTS, scenario
from tuiwatch.demo.healthy import VARIANTS, run_healthy
from tuiwatch.demo.problems import MODELS
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.records import Record

SEEDS = range(5)
HEALTHY_STEPS = 1000


@dataclass
class Row:
    run: str
    expected: str | None
    steps: int
    ended: str
    alerts: list[tuple[str, int | None, str]]  # (rule, step, severity), warnings and criticals only

    def first(self, rule: str) -> int | None:
        return next((step for r, step, _ in self.alerts if r == rule), None)


def _alerts(ledger: Sequence[Record]) -> list[tuple[str, int | None, str]]:
    return [
        (str(r["rule"]), r.get("step"), str(r["severity"]))
        for r in ledger
        if r.get("kind") == "alert" and r.get("severity") != "info"
    ]


def fault_row(name: str, run_dir: Path, steps: int = 1000) -> Row:
    module = scenario(name)
    outcome = module.run(steps=getattr(module, "STEPS", steps), run_dir=run_dir)
    ledger = list(read_ledger(outcome.watch.run_dir or ""))
    ended = type(outcome.error).__name__ if outcome.error else "finished"
    return Row(name, module.RULE, outcome.steps, ended, _alerts(ledger))


def healthy_row(model: str, variant: str, seed: int, run_dir: Path, steps: int = HEALTHY_STEPS) -> Row:
    outcome = run_healthy(model, seed=seed, variant=variant, steps=steps, run_dir=run_dir)
    ledger = list(read_ledger(outcome.watch.run_dir or ""))
    return Row(f"{model} {variant} seed {seed}", None, outcome.steps, "finished", _alerts(ledger))


def all_rows() -> tuple[list[Row], list[Row]]:
    with tempfile.TemporaryDirectory(prefix="tuiwatch-matrix-") as tmp:
        faults = [fault_row(name, Path(tmp)) for name in FAULTS]
        healthy = [healthy_row(m, v, s, Path(tmp)) for m in MODELS for v in VARIANTS for s in SEEDS]
    return faults, healthy


def as_markdown(faults: list[Row], healthy: list[Row]) -> str:
    lines = [
        "| fault | expected rule | fired at step | every warning/critical alert (rule@step) | steps run | ended |",
        "|---|---|---|---|---|---|",
    ]
    for row in faults:
        first = row.first(row.expected or "")
        seen = ", ".join(f"`{r}`@{s}" for r, s, _ in row.alerts[:8]) + (" …" if len(row.alerts) > 8 else "")
        lines.append(
            f"| `{row.run}` | `{row.expected}` | {first if first is not None else '**missed**'} | "
            f"{seen} | {row.steps} | {row.ended} |"
        )
    lines += ["", "| healthy run | steps | warning/critical alerts |", "|---|---|---|"]
    for row in healthy:
        seen = ", ".join(f"`{r}`@{s}" for r, s, _ in row.alerts) or "none"
        lines.append(f"| {row.run} | {row.steps} | {seen} |")
    return "\n".join(lines)
