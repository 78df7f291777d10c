"""Diagnosis: pure rules over the record stream, one module per family, and their registry.

The same :class:`Diagnosis` runs inside the training process (on the
publisher's thread, so alerts fire with nobody watching) and in ``report``.
No torch, no Textual.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tuiwatch.ledger.records import Record
from tuiwatch.rules.base import Rule
from tuiwatch.rules.numeric import GradExplosion, GradZero, LossFrozen, NonFinite
from tuiwatch.rules.schedule import DataBound, EvalMode, LrZero

# Rule id → factory. Ids are public (SPEC §6); each factory takes its thresholds as keywords.
REGISTRY: dict[str, Callable[[], Rule]] = {
    "nonfinite": NonFinite,
    "grad-explosion": GradExplosion,
    "grad-zero": GradZero,
    "loss-frozen": LossFrozen,
    "lr-zero": LrZero,
    "eval-mode": EvalMode,
    "data-bound": DataBound,
}


class Diagnosis:
    """Feeds records to every rule; returns the alert records they raise."""

    def __init__(self, rules: Iterable[str] | None = None):
        unknown = set(rules or ()) - set(REGISTRY)
        if unknown:
            raise ValueError(f"unknown rule ids {sorted(unknown)}: known are {', '.join(REGISTRY)}")
        self.rules = [REGISTRY[r]() for r in (rules if rules is not None else REGISTRY)]

    def feed(self, record: Record) -> list[Record]:
        kind = record.get("kind")
        out = []
        for rule in self.rules:
            if kind in rule.kinds:
                found = rule.observe(record)
                if found is not None:
                    out.append(found)
        return out

    def run(self, records: Iterable[Record]) -> list[Record]:
        return [a for r in records if r.get("kind") != "alert" for a in self.feed(r)]


__all__ = ["REGISTRY", "Diagnosis", "Rule"]
