"""The loss: frozen, stuck at chance, spiking, or falling while the eval loss rises."""

from __future__ import annotations

import math
import statistics
from collections import deque

from tuiwatch.ledger.fields import integer, num
from tuiwatch.ledger.records import AlertRecord, Record, alert_record
from tuiwatch.rules.base import Rule


class LossFrozen(Rule):
    """The loss is exactly the same number for many steps in a row."""

    id = "loss-frozen"

    def __init__(self, steps: int = 50):
        super().__init__()
        self.steps = steps
        self.last: float | None = None
        self.run = 0

    def check(self, record: Record) -> AlertRecord | None:
        loss = num(record.get("loss"))
        if loss is None:
            return None
        self.run = self.run + 1 if loss == self.last else 1
        self.last = loss
        if self.run < self.steps:
            return None
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"loss is {loss!r} for {self.run} steps in a row",
            {"loss": loss, "steps": self.run},
            "the model is not changing: look at the update norm and the lr",
        )

    def clears(self, record: Record) -> bool:
        loss = num(record.get("loss"))
        changed = loss is not None and loss != self.last
        self.last = loss if loss is not None else self.last
        if changed:
            self.run = 1
        return changed


class LossChance(Rule):
    """A classifier's loss sits at ln(C), what guessing uniformly among C classes scores.

    C comes from the rule's ``classes`` threshold, else from the ``classes``
    field the publisher writes once (the width of the model's 2-D output).
    Fires when, after ``min_steps`` steps, the median of the last ``window``
    losses is within ``tolerance`` of ln(C) and none of them went below
    ``(1 - 2 * tolerance) * ln(C)``; clears when the median falls below that.
    """

    id = "loss-chance"

    def __init__(self, classes: int | None = None, window: int = 100, min_steps: int = 200, tolerance: float = 0.1):
        super().__init__()
        self.classes = classes
        self.window, self.min_steps, self.tolerance = window, min_steps, tolerance
        self.recent: deque[float] = deque(maxlen=window)
        self.seen = 0

    def _push(self, record: Record) -> float | None:
        """The chance-level loss ln(C), once this record is in the window and C is known."""
        if self.classes is None and integer(record.get("classes")) is not None:
            self.classes = record["classes"]
        loss = num(record.get("loss"))
        if loss is None or not math.isfinite(loss):
            return None
        self.recent.append(loss)
        self.seen += 1
        if self.classes is None or self.classes < 2 or self.seen < self.min_steps:
            return None
        return math.log(self.classes)

    def check(self, record: Record) -> AlertRecord | None:
        chance = self._push(record)
        if chance is None:
            return None
        median = statistics.median(self.recent)
        if abs(median - chance) > self.tolerance * chance or min(self.recent) < (1 - 2 * self.tolerance) * chance:
            return None
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"loss {median:.3f} is at chance level ln({self.classes}) = {chance:.3f} "
            f"(median of the last {len(self.recent)} steps)",
            {"loss_median": median, "chance": chance, "classes": self.classes, "window": len(self.recent)},
            "the labels (shuffled? misaligned?), the output/loss contract (an extra softmax?), the lr",
        )

    def clears(self, record: Record) -> bool:
        chance = self._push(record)
        return chance is not None and statistics.median(self.recent) < (1 - 2 * self.tolerance) * chance


class LossSpike(Rule):
    """One step's loss far outside the recent spread: a bad batch, usually.

    Fires when the loss is above ``median + k × MAD`` of the last ``window``
    finite losses (MAD scaled to a standard deviation, at least 1 % of the
    median so a flat loss is not hair-trigger) and above ``ratio`` × the
    median. Needs ``min_history`` losses first. The spike does not enter the
    window, so one bad batch cannot raise the bar for the next.
    """

    id = "loss-spike"
    clear_after = 20

    def __init__(self, window: int = 100, k: float = 12.0, ratio: float = 2.0, min_history: int = 30):
        super().__init__()
        self.recent: deque[float] = deque(maxlen=window)
        self.k, self.ratio, self.min_history = k, ratio, min_history
        self.bar: float | None = None
        self.added = 0

    def _spiked(self, record: Record) -> float | None:
        """The loss if it is a spike; an ordinary loss joins the window (the bar moves every 25 of them)."""
        loss = num(record.get("loss"))
        if loss is None or not math.isfinite(loss):
            return None
        if self.bar is not None and loss > self.bar:
            return loss
        self.recent.append(loss)
        self.added += 1
        if len(self.recent) >= self.min_history and (self.bar is None or self.added % 25 == 0):
            median = statistics.median(self.recent)
            mad = statistics.median(abs(v - median) for v in self.recent) * 1.4826
            self.bar = max(median + self.k * max(mad, 0.01 * abs(median)), self.ratio * median)
        return None

    def check(self, record: Record) -> AlertRecord | None:
        loss = self._spiked(record)
        if loss is None:
            return None
        median = statistics.median(self.recent)
        ids = record.get("batch_ids")
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"loss {loss:.4g} jumped to {loss / median:.1f}x its recent median {median:.4g}",
            {"loss": loss, "median": median, "bar": self.bar, "batch_ids": ids[:64] if isinstance(ids, list) else None},
            "look at this batch (its ids are in the evidence and its tensors in the dump), then the lr",
        )

    def clears(self, record: Record) -> bool:
        # A spike is one step: the next ordinary loss ends it.
        return num(record.get("loss")) is not None and self._spiked(record) is None


class Overfit(Rule):
    """The training loss keeps falling while the eval loss rises.

    Watches the eval records' loss (``val_loss``, ``eval_loss``, or the first
    field with "loss" in its name) and the mean of the last ``train_window``
    training losses at each eval. Fires when the eval loss rose on ``rises``
    evals in a row, ends more than ``margin`` above its best, and the training
    loss is lower than it was at that best eval. Clears at a new best eval loss.
    """

    id = "overfit"
    kinds = ("step", "eval")

    def __init__(self, rises: int = 3, margin: float = 0.05, train_window: int = 20):
        super().__init__()
        self.rises_needed, self.margin = rises, margin
        self.train: deque[float] = deque(maxlen=train_window)
        self.best: tuple[float, float] | None = None  # (eval loss, train loss then)
        self.last_eval: float | None = None
        self.rises = 0

    def _eval(self, record: Record) -> tuple[float, float] | None:
        """Fold a record in; for an eval record with a loss, return (eval loss, train loss now)."""
        if record.get("kind") == "step":
            loss = num(record.get("loss"))
            if loss is not None and math.isfinite(loss):
                self.train.append(loss)
            return None
        value = next((num(record.get(k)) for k in ("val_loss", "eval_loss") if k in record), None)
        if value is None:
            key = next((k for k in record if "loss" in k), None)
            value = num(record.get(key)) if key else None
        if value is None or not math.isfinite(value) or not self.train:
            return None
        train = statistics.fmean(self.train)
        self.rises = self.rises + 1 if self.last_eval is not None and value > self.last_eval else 0
        self.last_eval = value
        return value, train

    def check(self, record: Record) -> AlertRecord | None:
        point = self._eval(record)
        if point is None:
            return None
        value, train = point
        if self.best is None or value < self.best[0]:
            self.best = point
            return None
        best, train_at_best = self.best
        if self.rises < self.rises_needed or value <= best * (1 + self.margin) or train >= train_at_best:
            return None
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"eval loss rose {self.rises} times in a row to {value:.4g} (best {best:.4g}) "
            f"while the training loss fell to {train:.4g} (from {train_at_best:.4g})",
            {
                "eval_loss": value,
                "best_eval_loss": best,
                "train_loss": train,
                "train_loss_at_best": train_at_best,
                "rises": self.rises,
            },
            "regularise (dropout, weight decay, augmentation), stop early at the best eval, more data",
        )

    def clears(self, record: Record) -> bool:
        point = self._eval(record)
        if point is not None and self.best is not None and point[0] < self.best[0]:
            self.best = point
            return True
        return False
