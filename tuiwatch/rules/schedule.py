"""Rules about the loop around the model: the learning rate, eval mode, and the data loader."""

from __future__ import annotations

from collections import deque

from tuiwatch.ledger.records import Record
from tuiwatch.rules.base import Rule, alert, number


class LrZero(Rule):
    """Every param group's learning rate is 0, or collapsed, on consecutive optimizer steps.

    Collapsed: at most ``collapse`` × the largest lr that group has had (a
    decay by eight orders of magnitude does nothing a 0 would not). A cosine
    schedule touches 0 for one step at its end and a warm-up starts there:
    only a run of ``steps`` optimizer steps counts.
    """

    id = "lr-zero"

    def __init__(self, steps: int = 10, collapse: float = 1e-8):
        super().__init__()
        self.steps, self.collapse = steps, collapse
        self.run = 0
        self.peak: list[float] = []

    def _zero(self, record: Record) -> bool | None:
        lr = record.get("lr")
        if record.get("opt_step") is None or not isinstance(lr, list) or not lr:
            return None
        values = [number(v) for v in lr]
        if any(v is None for v in values):
            return None
        if len(self.peak) != len(values):
            self.peak = [0.0] * len(values)
        self.peak = [max(p, abs(v or 0.0)) for p, v in zip(self.peak, values, strict=True)]
        return all(v == 0 or abs(v or 0.0) <= self.collapse * p for v, p in zip(values, self.peak, strict=True))

    def check(self, record: Record) -> Record | None:
        zero = self._zero(record)
        if zero is None:
            return None
        self.run = self.run + 1 if zero else 0
        if self.run < self.steps:
            return None
        lr = record.get("lr")
        collapsed = any(v != 0 for v in lr or ())
        return alert(
            self.id, "warning", record.get("step"),
            f"learning rate is {'collapsed to ' + str(lr) if collapsed else '0'} for {self.run} optimizer steps"
            + (f" (it was {self.peak})" if collapsed else ""),
            {"lr": lr, "peak_lr": list(self.peak), "steps": self.run},
            "read the schedule (warm-up, decay, step size; scheduler.step() once per epoch or per batch?)",
        )  # fmt: skip

    def clears(self, record: Record) -> bool:
        if self._zero(record) is False:
            self.run = 0
            return True
        return False


class EvalMode(Rule):
    """Validation ran with the model in training mode (dropout and batch-norm updates on)."""

    id = "eval-mode"
    kinds = ("eval",)

    def check(self, record: Record) -> Record | None:
        if record.get("training") is not True:
            return None
        return alert(
            self.id, "warning", record.get("step"), "eval metrics were logged with model.training == True",
            {"training": True}, "call model.eval() before validating (and model.train() after)",
        )  # fmt: skip


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

    def check(self, record: Record) -> Record | None:
        # Counts instead of a sorted window: "most steps over 50 %" is the median over 50 %.
        if not self._push(record) or self.over * 2 <= self.window:
            return None
        share = sorted(self.recent)[self.window // 2]
        return alert(
            self.id, "warning", record.get("step"),
            f"waiting for data takes {share:.0%} of the step (median of the last {self.window} steps)",
            {"data_wait_share": share, "data_wait_s": record.get("data_wait_s"), "compute_s": record.get("compute_s")},
            "more loader workers, lighter transforms, faster storage, pin_memory",
        )  # fmt: skip

    def clears(self, record: Record) -> bool:
        return self._push(record) and self.under * 2 > self.window
