"""The loop around the model: a loader that keeps it waiting, evaluation in training mode."""

from __future__ import annotations

from collections import deque

from tuiwatch.ledger.records import AlertRecord, Record, alert_record
from tuiwatch.rules.base import Rule


class DataBound(Rule):
    """Waiting for data takes most of the step time: over 50 % on most of the last 50 steps.

    Steps that wait less than ``min_wait_s`` count as not waiting: a tiny model
    on an in-memory dataset spends half of a 0.2 ms step in the loader, and no
    loader setting would buy anything there.
    """

    id = "data-bound"

    def __init__(self, window: int = 50, share: float = 0.5, clear_share: float = 0.3, min_wait_s: float = 0.001):
        super().__init__()
        self.window, self.share, self.clear_share, self.min_wait_s = window, share, clear_share, min_wait_s
        self.recent: deque[float] = deque()
        self.over = 0  # steps in the window waiting more than `share`
        self.under = 0  # steps in the window waiting less than `clear_share`

    def _push(self, record: Record) -> bool:
        """Add this step's wait share to the window; False when the window is not full yet."""
        wait, compute = record.get("data_wait_s"), record.get("compute_s")
        if type(wait) is not float or type(compute) is not float or wait + compute <= 0:
            return False
        # A wait under min_wait_s is not worth a worker, whatever its share of a tiny step.
        value = wait / (wait + compute) if wait >= self.min_wait_s else 0.0
        self.recent.append(value)
        self.over += value > self.share
        self.under += value < self.clear_share
        if len(self.recent) > self.window:
            old = self.recent.popleft()
            self.over -= old > self.share
            self.under -= old < self.clear_share
        return len(self.recent) == self.window

    def check(self, record: Record) -> AlertRecord | None:
        # Counts instead of a sorted window: "most steps over 50 %" is the median over 50 %.
        if not self._push(record) or self.over * 2 <= self.window:
            return None
        share = sorted(self.recent)[self.window // 2]
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"waiting for data takes {share:.0%} of the step (median of the last {self.window} steps)",
            {"data_wait_share": share, "data_wait_s": record.get("data_wait_s"), "compute_s": record.get("compute_s")},
            "more loader workers, lighter transforms, faster storage, pin_memory",
        )

    def clears(self, record: Record) -> bool:
        return self._push(record) and self.under * 2 > self.window


class EvalMode(Rule):
    """Validation ran with the model in training mode (dropout and batch-norm updates on)."""

    id = "eval-mode"
    kinds = ("eval",)

    def check(self, record: Record) -> AlertRecord | None:
        if record.get("training") is not True:
            return None
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            "eval metrics were logged with model.training == True",
            {"training": True},
            "call model.eval() before validating (and model.train() after)",
        )
