"""``--compare B``: a finished run drawn beside the one watched, and the first step where the two part. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuiwatch.analysis.diff import Parting
from tuiwatch.ledger.records import Record
from tuiwatch.viewer.state import RunState


@dataclass
class Baseline:
    label: str  # the other run's name, as the charts' legend says it
    state: RunState  # its records folded, once
    parting: Parting  # fed the watched run's records as they come

    @property
    def parted(self) -> int | None:
        """The first step where the watched run differs from this one, once found."""
        found = self.parting.found
        return found.step if found is not None else None

    @classmethod
    def of(cls, records: Sequence[Record], label: str | None = None) -> Baseline:
        state = RunState()
        state.apply_all(records)
        name = str(state.run.get("name") or "") or label or "baseline"
        return cls(name, state, Parting(records))
