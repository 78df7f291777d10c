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
from typing import Any, NamedTuple

from tuiwatch.demo.styles import FAULTS, SCHEDULES, STYLES, run_style
from tuiwatch.rules import REGISTRY

# Combinations the loop itself refuses before any rule could speak.
NOT_PLANTED = {("autocast", "detached"): "GradScaler raises 'No inf checks were recorded' when no gradient arrives"}


# Where a rule sits in the chain data → model → loss → …: among alerts about one step, the first broken link.
CHAIN = {rule: i for i, rule in enumerate(REGISTRY)}


class Seen(NamedTuple):
    """A warning or critical alert: its rule, the step it names, and the last step the run had reached then."""

    rule: str
    step: int | None
    at: int


@dataclass
class Healthy:
    style: str
    schedule: str
    seed: int
    steps: int
    alerts: list[Seen]


@dataclass
class Planted:
    style: str
    schedule: str
    seed: int
    fault: str
    onset: int
    alerts: list[Seen]

    @property
    def rule(self) -> str:
        return FAULTS[self.fault]

    @property
    def delay(self) -> int | None:
        """Steps from the onset to when the expected rule's first alert about it was written."""
        found = [a.at for a in self.alerts if a.rule == self.rule and a.step is not None and a.step >= self.onset]
        return found[0] - self.onset if found else None

    @property
    def named_first(self) -> str | None:
        """The first broken link named: of the alerts about a step at or after the onset, the earliest step's,
        and among one step's, the earliest in the chain (as the alert pane's newest-first order shows them)."""
        after = [a for a in self.alerts if a.step is not None and a.step >= self.onset]
        return min(after, key=lambda a: (a.step, CHAIN[a.rule])).rule if after else None

    @property
    def first(self) -> bool:
        return self.named_first == self.rule


def alerts_seen(records: Sequence[dict[str, Any]]) -> list[Seen]:
    seen, reached = [], 0
    for r in records:
        if r.get("kind") == "step":
            reached = r["step"]
        elif r.get("kind") == "alert" and r["severity"] != "info":
            seen.append(Seen(str(r["rule"]), r.get("step"), reached))
    return seen


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
                    healthy.append(Healthy(style, schedule, seed, count, alerts_seen(records)))
                    progress(f"healthy {style} {schedule} {seed}")
            for fault in FAULTS:
                if (style, fault) in NOT_PLANTED:
                    continue
                # Each fault under each schedule, a different seed (so a different onset) for each.
                for seed, schedule in enumerate(SCHEDULES):
                    records, onset = run_style(style, schedule, seed, steps=steps, run_dir=Path(tmp), fault=fault)
                    assert onset is not None
                    planted.append(Planted(style, schedule, seed, fault, onset, alerts_seen(records)))
                    progress(f"fault {style} {fault} {schedule}")
    return healthy, planted


def as_markdown(healthy: list[Healthy], planted: list[Planted], seeds: int) -> str:
    steps = sum(h.steps for h in healthy)
    lines = [
        f"{len(healthy)} healthy runs ({len(STYLES)} loop styles × {len(SCHEDULES)} schedules × {seeds} seeds, "
        f"{steps:,} steps) and {len(planted)} planted faults (each fault in each style under each schedule, "
        "onset at a seeded step in the run's second quarter). Steps onset → alert count to when the alert "
        "was written (a loss spike is judged 3 steps after it, and names its own step).",
        "",
        "| rule | false alarms per 1,000 healthy steps | planted fault | named | named first | steps onset → alert "
        "(median, max) |",
        "|---|---|---|---|---|---|",
    ]
    for rule in REGISTRY:
        false = sum(a.rule == rule for h in healthy for a in h.alerts)
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
        + (", ".join(f"{h.style}/{h.schedule}/seed {h.seed}: {_named(h.alerts)}" for h in noisy) or "none")
        + "."
    )
    others = [p for p in planted if not p.first]
    if others:
        lines.append(
            "Planted faults another rule named first: "
            + ", ".join(f"{p.fault} in {p.style}/{p.schedule} (first: `{p.named_first}`)" for p in others)
            + "."
        )
    lines.append("Not planted: " + "; ".join(f"{f} in {s} ({why})" for (s, f), why in NOT_PLANTED.items()) + ".")
    return "\n".join(lines)


def _named(alerts: list[Seen]) -> str:
    return ", ".join(f"`{a.rule}`@{a.step}" for a in alerts[:3])
