"""The loss: frozen, stuck at chance, spiking, or falling while the eval loss rises."""

from __future__ import annotations

import math
import statistics
from collections import deque

from tuiwatch.ledger.fields import integer, num
from tuiwatch.ledger.records import AlertRecord, Record, alert_record
from tuiwatch.rules.base import Rule, top_lr


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
    field the publisher writes once (the last dimension of logits the output
    names, or the width of a 2-D output); unknown C, no alert. The schedule
    must have let the model learn: the lr has not risen for ``window`` steps
    (a warm-up still climbing from 0 keeps the loss near ln(C) by design).
    Fires when, after ``min_steps`` steps, the median of the last ``window``
    losses is within ``tolerance`` of ln(C) and none of them went below
    ``(1 - 2 * tolerance) * ln(C)``; clears when the median falls below that.
    """

    id = "loss-chance"

    def __init__(self, classes: int | None = None, window: int = 100, min_steps: int = 200, tolerance: float = 0.1):
        super().__init__()
        self.classes = classes
        self.source = "rules={'loss-chance': {'classes': ...}}" if classes is not None else None
        self.window, self.min_steps, self.tolerance = window, min_steps, tolerance
        self.recent: deque[float] = deque(maxlen=window)
        self.seen = 0
        self.last_lr: float | None = None
        self.peak_lr = 0.0
        self.since_rise = 0  # steps with a known lr since it last rose

    def _schedule(self, record: Record) -> None:
        top = top_lr(record)
        if top is None:
            return
        self.since_rise = 0 if self.last_lr is not None and top > self.last_lr else self.since_rise + 1
        self.last_lr = top
        self.peak_lr = max(self.peak_lr, top)

    def _push(self, record: Record) -> float | None:
        """The chance-level loss ln(C), once this record is in the window, C is known and the lr has settled."""
        if self.classes is None and integer(record.get("classes")) is not None:
            self.classes = record["classes"]
            self.source = "the model's output (its logits' last dimension, or a 2-D output's width)"
        self._schedule(record)
        loss = num(record.get("loss"))
        if loss is None or not math.isfinite(loss):
            return None
        self.recent.append(loss)
        self.seen += 1
        if self.classes is None or self.classes < 2 or self.seen < self.min_steps:
            return None
        if self.last_lr is not None and self.since_rise < self.window:
            return None  # the lr is still rising (a warm-up): a loss near chance is expected
        return math.log(self.classes)

    def check(self, record: Record) -> AlertRecord | None:
        chance = self._push(record)
        if chance is None:
            return None
        median = statistics.median(self.recent)
        if abs(median - chance) > self.tolerance * chance or min(self.recent) < (1 - 2 * self.tolerance) * chance:
            return None
        schedule = (
            "no lr in the records"
            if self.last_lr is None
            else f"lr {self.last_lr:.3g}, not risen for {self.since_rise} steps (peak {self.peak_lr:.3g})"
        )
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"loss {median:.3f} is at chance level ln({self.classes}) = {chance:.3f} "
            f"(median of the last {len(self.recent)} steps)",
            {
                "loss_median": median,
                "chance": chance,
                "classes": self.classes,
                "classes_from": self.source,
                "window": len(self.recent),
                "schedule": schedule,
            },
            "the labels (shuffled? misaligned?), the output/loss contract (an extra softmax?), the lr",
        )

    def clears(self, record: Record) -> bool:
        chance = self._push(record)
        return chance is not None and statistics.median(self.recent) < (1 - 2 * self.tolerance) * chance


class LossSpike(Rule):
    """One step's loss far outside the recent spread: a bad batch, usually.

    Per-batch losses are heavy-tailed (a small batch, dropout, a converged
    classifier scoring ~0 on most batches and 3 on one), and schedules move
    their level, so a bar of median + k × spread fires on healthy noise. The
    bar is instead ``ratio`` × the largest of the last ``window`` ordinary
    losses: above anything the run's own noise reached lately, by a factor.
    A schedule's decay lowers the losses and leaves the bar high for a while
    (less sensitive, never a false alarm). For losses that can be negative (a
    log-likelihood, an ELBO), the window's median + ``k`` × MAD is the bar.
    Needs ``min_history`` losses; a spike does not enter the window; the bar
    is refreshed every ``refresh`` losses. Right after the lr rose by half
    or more (a warm restart), a higher loss is the schedule's: no spike for
    ``lr_hold`` steps.
    """

    id = "loss-spike"
    clear_after = 3

    def __init__(
        self,
        window: int = 200,
        ratio: float = 3.0,
        k: float = 12.0,
        min_history: int = 30,
        refresh: int = 25,
        lr_hold: int = 10,
    ):
        super().__init__()
        self.recent: deque[float] = deque(maxlen=window)
        self.ratio, self.k, self.min_history = ratio, k, min_history
        self.refresh, self.lr_hold = refresh, lr_hold
        self.bar: float | None = None
        self.basis: dict[str, float | int | str] = {}
        self.added = 0
        self.last_lr: float | None = None
        self.since_lr_rise = lr_hold

    def _lr_rose(self, record: Record) -> bool:
        top = top_lr(record)
        if top is not None:
            if self.last_lr is not None and top > 1.5 * self.last_lr:
                self.since_lr_rise = 0
            self.last_lr = top
        self.since_lr_rise += 1
        return self.since_lr_rise <= self.lr_hold

    def _refresh(self) -> None:
        values = list(self.recent)
        if min(values) >= 0:
            top = max(values)
            self.bar = self.ratio * top
            self.basis = {"rule": f"{self.ratio:g} x the window's largest loss", "window_max": top}
        else:
            median = statistics.median(values)
            spread = max(statistics.median(abs(v - median) for v in values) * 1.4826, 0.01 * abs(median))
            self.bar = median + self.k * spread
            self.basis = {"rule": f"median + {self.k:g} x MAD (the loss can be negative)", "mad": spread}
        self.basis["window"] = len(values)

    def _spiked(self, record: Record) -> float | None:
        """The loss if it is a spike; an ordinary loss joins the window."""
        loss = num(record.get("loss"))
        held = self._lr_rose(record)
        if loss is None or not math.isfinite(loss):
            return None
        if self.bar is not None and loss > self.bar and not held:
            return loss
        self.recent.append(loss)
        self.added += 1
        if len(self.recent) >= self.min_history and (self.bar is None or self.added % self.refresh == 0):
            self._refresh()
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
            f"loss {loss:.4g} jumped to {loss / median:.1f}x its recent median {median:.4g}"
            if median > 0
            else f"loss {loss:.4g} jumped far above its recent median {median:.4g}",
            {
                "loss": loss,
                "median": median,
                "bar": self.bar,
                **self.basis,
                "batch_ids": ids[:64] if isinstance(ids, list) else None,
            },
            "look at this batch (its ids are in the evidence and its tensors in the dump), then the lr",
        )

    def clears(self, record: Record) -> bool:
        # A spike is one step: ordinary losses end it.
        return num(record.get("loss")) is not None and self._spiked(record) is None


class Overfit(Rule):
    """The training loss keeps falling while the eval loss rises.

    Watches the eval records' loss (``val_loss``, ``eval_loss``, or the first
    field with "loss" in its name) and the mean of the last ``train_window``
    training losses at each eval. Fires when the eval loss rose on ``rises``
    evals in a row, ends more than ``margin`` above its best, and the training
    loss fell since that best eval by more than its own noise (``z`` standard
    errors of the two means: a noisy loss that wanders 2 % lower is not
    "falling"), and the training
    loss is lower than it was at that best eval. Clears at a new best eval loss.
    """

    id = "overfit"
    kinds = ("step", "eval")

    def __init__(self, rises: int = 3, margin: float = 0.05, train_window: int = 100, z: float = 3.0):
        super().__init__()
        self.rises_needed, self.margin = rises, margin
        self.train: deque[float] = deque(maxlen=train_window)
        self.z = z
        self.best: tuple[float, float, float] | None = None  # (eval loss, train loss then, its standard error)
        self.last_eval: float | None = None
        self.rises = 0

    def _eval(self, record: Record) -> tuple[float, float, float] | None:
        """Fold a record in; for an eval record with a loss: (eval loss, train loss now, its standard error)."""
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
        error = statistics.stdev(self.train) / math.sqrt(len(self.train)) if len(self.train) > 1 else 0.0
        self.rises = self.rises + 1 if self.last_eval is not None and value > self.last_eval else 0
        self.last_eval = value
        return value, train, error

    def check(self, record: Record) -> AlertRecord | None:
        point = self._eval(record)
        if point is None:
            return None
        value, train, error = point
        if self.best is None or value < self.best[0]:
            self.best = point
            return None
        best, train_at_best, error_at_best = self.best
        noise = self.z * math.hypot(error, error_at_best)
        if self.rises < self.rises_needed or value <= best * (1 + self.margin) or train >= train_at_best - noise:
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
                "train_noise": noise,
                "train_window": len(self.train),
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
