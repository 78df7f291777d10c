"""The gradients: exploding, or zero / missing."""

from __future__ import annotations

import math
import statistics
from collections import deque

from tuiwatch.ledger.fields import num
from tuiwatch.ledger.numbers import number
from tuiwatch.ledger.records import AlertRecord, Record, alert_record
from tuiwatch.rules.base import Learned, Rule


class GradExplosion(Rule):
    """The pre-clip gradient norm jumps orders of magnitude above its recent median, or is huge."""

    id = "grad-explosion"
    clear_after = 20

    def __init__(self, window: int = 50, ratio: float = 100.0, huge: float = 1e6, min_history: int = 20):
        super().__init__()
        self.recent: deque[float] = deque(maxlen=window)
        self.ratio, self.huge, self.min_history = ratio, huge, min_history
        self.low = math.inf  # a lower bound of the window's least norm (exact after each full look)

    def _append(self, norm: float) -> None:
        self.recent.append(norm)
        if norm < self.low:
            self.low = norm

    def check(self, record: Record) -> AlertRecord | None:
        norm = num(record.get("grad_norm"))
        if norm is None or not math.isfinite(norm):
            return None
        recent = self.recent
        # Cheap test first: a norm under ratio × the window's minimum cannot beat ratio × its median; under
        # ratio × a lower bound of that minimum (the window only loses values) it cannot either.
        suspect = len(recent) >= self.min_history and norm > self.ratio * self.low
        if suspect:
            self.low = min(recent)
            suspect = norm > self.ratio * self.low
        if not suspect and norm < self.huge:
            self._append(norm)
            return None
        history = list(recent)
        self._append(norm)
        median = statistics.median(history) if len(history) >= self.min_history else None
        jumped = median is not None and median > 0 and norm > self.ratio * median
        if not jumped and norm < self.huge:
            return None
        last = [*history[-3:], norm]
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"grad norm {number(norm, 3)}"
            + (
                f" is {number(norm / median, 3)}x its recent median {number(median, 3)}"
                if jumped and median
                else " is huge"
            )
            + f"; last: {' → '.join(number(v, 3) for v in last)}",
            {"grad_norm": norm, "median": median, "last": last},
            "lower the lr, check init and normalisation, clip gradients",
        )

    def clears(self, record: Record) -> bool:
        norm = num(record.get("grad_norm"))
        if norm is None or not math.isfinite(norm):
            return False
        history = list(self.recent)
        self._append(norm)
        return norm < self.huge and (not history or norm < 10 * statistics.median(history))


class GradZero(Rule):
    """The optimizer steps, but the gradients are all zero (or there are none).

    Zero gradients of a loss of exactly 0 are a loss at its floor, once the
    run has had something to learn from (a loss or a gradient that was not 0):
    a solved task, not a broken graph. A loss that has been 0 at every step
    since the run's first, with zero gradients, never depended on the model.
    """

    id = "grad-zero"

    def __init__(self, steps: int = 5):
        super().__init__()
        self.steps = steps
        self.run = 0
        self.learned = Learned()

    def check(self, record: Record) -> AlertRecord | None:
        if self.learned.yes is not True:  # (once the run has learned, one test a record)
            self.learned.see(record)
        if record.get("opt_step") is None:
            return None
        norm = record.get("grad_norm")
        never = False
        if norm == 0 and record.get("loss") == 0:
            if self.learned.yes:
                # Nothing to learn from, not a broken graph: a loss at its floor has no gradient (a solved CartPole
                # under A2C, its returns predicted exactly; a classifier whose margins underflow its loss to 0.0).
                return None
            never = True
        self.run = self.run + 1 if norm is None or norm == 0 else 0
        if self.run < self.steps:
            return None
        if never:
            return alert_record(
                self.id,
                "critical",
                record.get("step"),
                f"gradients are all zero for {self.run} optimizer steps, and the loss has been 0 at every step "
                "since the first",
                {"grad_norm": norm, "steps": self.run, "loss": record.get("loss")},
                "a loss that does not depend on the model: cross_entropy over one output column is 0 whatever the "
                "input (one regression output needs mse_loss); a loss multiplied by 0",
            )
        return alert_record(
            self.id,
            "critical",
            record.get("step"),
            f"gradients are {'missing' if norm is None else 'all zero'} for {self.run} optimizer steps",
            {"grad_norm": norm, "steps": self.run},
            "a detached graph, no_grad, frozen params, or a loss that does not depend on the model",
        )

    def clears(self, record: Record) -> bool:
        norm = record.get("grad_norm")
        if record.get("opt_step") is not None and norm:
            self.run = 0
            return True
        return False
