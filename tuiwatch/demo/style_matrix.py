"""The generalisation matrix of docs/rules.md: every loop style × schedule × seed healthy, every fault planted.

Per rule: false alarms per 1,000 healthy steps, and for the fault it exists
for, how often it named it, whether it was the first alert, and how many
steps after the onset. ``bench/rule_matrix.py`` runs it and writes the tables.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuiwatch.demo.styles import FAULTS, SCHEDULES, STYLES, run_style
from tuiwatch.rules import REGISTRY

# Combinations the loop itself refuses before any rule could speak.
NOT_PLANTED = {("autocast", "detached"): "GradScaler raises 'No inf checks were recorded' when no gradient arrives"}


@dataclass
class Healthy:
    style: str
    schedule: str
    seed: int
    steps: int
    alerts: list[tuple[str, int | None]]  # warnings and criticals


@dataclass
class Planted:
    style: str
    fault: str
    onset: int
    alerts: list[tuple[str, int | None]]

    @property
    def rule(self) -> str:
        return FAULTS[self.fault]

    @property
    def delay(self) -> int | None:
        """Steps from the onset to the expected rule's first alert at or after it."""
        found = [s for r, s in self.alerts if r == self.rule and s is not None and s >= self.onset]
        return found[0] - self.onset if found else None

    @property
    def named_first(self) -> str | None:
        """The rule of the first alert (in ledger order) at or after the onset."""
        return next((r for r, s in self.alerts if s is not None and s >= self.onset), None)

    @property
    def first(self) -> bool:
        return self.named_first == self.rule


def _alerts(records: Sequence[dict[str, Any]]) -> list[tuple[str, int | None]]:
    return [(str(r["rule"]), r.get("step")) for r in records if r.get("kind") == "alert" and r["severity"] != "info"]


def run(
    seeds: Sequence[int], steps: int = 1000, progress: Callable[[str], None] = lambda _: None
) -> tuple[list[Healthy], list[Planted]]:
    healthy, planted = [], []
    with tempfile.TemporaryDirectory(prefix="tuiwatch-styles-") as tmp:
        for style in STYLES:
            for schedule in SCHEDULES:
                for seed in seeds:
                    records, _ = run_style(style, schedule, seed, steps=steps, run_dir=Path(tmp))
                    count = sum(r.get("kind") == "step" for r in records)
                    healthy.append(Healthy(style, schedule, seed, count, _alerts(records)))
                    progress(f"healthy {style} {schedule} {seed}")
            for fault in FAULTS:
                if (style, fault) in NOT_PLANTED:
                    continue
                records, onset = run_style(style, "step_decay", 0, steps=steps, run_dir=Path(tmp), fault=fault)
                assert onset is not None
                planted.append(Planted(style, fault, onset, _alerts(records)))
                progress(f"fault {style} {fault}")
    return healthy, planted


def as_markdown(healthy: list[Healthy], planted: list[Planted], seeds: int) -> str:
    steps = sum(h.steps for h in healthy)
    lines = [
        f"{len(healthy)} healthy runs ({len(STYLES)} loop styles × {len(SCHEDULES)} schedules × {seeds} seeds, "
        f"{steps:,} steps) and {len(planted)} planted faults (each fault in each style, step decay, "
        "onset at a seeded step in the run's second quarter).",
        "",
        "| rule | false alarms per 1,000 healthy steps | planted fault | named | named first | steps onset → alert "
        "(median, max) |",
        "|---|---|---|---|---|---|",
    ]
    for rule in REGISTRY:
        false = sum(r == rule for h in healthy for r, _ in h.alerts)
        mine = [p for p in planted if p.rule == rule]
        delays = [p.delay for p in mine if p.delay is not None]
        fault = next((f for f, r in FAULTS.items() if r == rule), None)
        lines.append(
            f"| `{rule}` | {1000 * false / steps:.2f} | {f'`{fault}`' if fault else '-'} | "
            + (f"{len(delays)}/{len(mine)} | {sum(p.first for p in mine)}/{len(mine)} | " if mine else "- | - | ")
            + (f"{statistics.median(delays):.0f}, {max(delays)} |" if delays else "- |")
        )
    noisy = [h for h in healthy if h.alerts]
    lines.append("")
    lines.append(
        "Healthy runs with a warning or critical alert: "
        + (", ".join(f"{h.style}/{h.schedule}/seed {h.seed}: {h.alerts[:3]}" for h in noisy) or "none")
        + "."
    )
    others = [p for p in planted if not p.first]
    if others:
        lines.append(
            "Planted faults another rule named first: "
            + ", ".join(f"{p.fault} in {p.style} (first: `{p.named_first}`)" for p in others)
            + "."
        )
    lines.append("Not planted: " + "; ".join(f"{f} in {s} ({why})" for (s, f), why in NOT_PLANTED.items()) + ".")
    return "\n".join(lines)
