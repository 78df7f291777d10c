"""The loss: frozen, stuck at chance, spiking, or falling while the eval loss rises."""

from __future__ import annotations

import bisect
import math
import operator
import statistics
from collections import deque
from typing import Any

from tuiwatch.ledger.fields import integer, num
from tuiwatch.ledger.numbers import number
from tuiwatch.ledger.records import AlertRecord, Record, alert_record
from tuiwatch.rules.base import Learned, Rule, top_lr


class LossFrozen(Rule):
    """The loss is exactly the same number for many steps in a row.

    Where the optimizer stepped on zero gradients at every one of those steps,
    the loss does not depend on the model at all, and the advice says so
    rather than pointing at the update norm and the lr. A loss of exactly 0
    with zero gradients after the run had something to learn from is a loss
    at its floor, as grad-zero takes it: a single sample fitted exactly
    (a transfer-learning tutorial's regression on one example) is no alarm.
    """

    id = "loss-frozen"

    def __init__(self, steps: int = 50):
        super().__init__()
        self.steps = steps
        self.last: float | None = None
        self.run = 0
        self.zero_grads = 0  # steps of the run in which the optimizer stepped on a gradient norm of exactly 0
        self.learned = Learned()

    def check(self, record: Record) -> AlertRecord | None:
        if self.learned.yes is not True:  # (once the run has learned, one test a record)
            self.learned.see(record)
        loss = num(record.get("loss"))
        if loss is None:
            return None
        if loss != self.last:
            self.run = self.zero_grads = 0
        self.run += 1
        self.last = loss
        if record.get("grad_norm") == 0 and record.get("opt_step") is not None:
            self.zero_grads += 1
        if self.run < self.steps:
            return None
        no_gradient = self.zero_grads == self.run
        if no_gradient and loss == 0 and self.learned.yes:
            return None  # a loss at its floor
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"loss is {loss!r} for {self.run} steps in a row" + (", every gradient zero" if no_gradient else ""),
            {"loss": loss, "steps": self.run, **({"zero_grad_steps": self.zero_grads} if no_gradient else {})},
            "the loss does not depend on the model: the optimizer stepped on zero gradients (grad-zero)"
            if no_gradient
            else "the model is not changing: look at the update norm and the lr",
        )

    def clears(self, record: Record) -> bool:
        loss = num(record.get("loss"))
        changed = loss is not None and loss != self.last
        self.last = loss if loss is not None else self.last
        if changed:
            self.run = 1
            self.zero_grads = int(record.get("grad_norm") == 0 and record.get("opt_step") is not None)
        return changed


class LossChance(Rule):
    """A classifier's loss sits at ln(C), what guessing uniformly among C classes scores.

    C comes from the rule's ``classes`` threshold, else from the ``classes``
    field the publisher writes once (the last dimension of logits the output
    names, or the width of a 2-D output); unknown C, no alert.

    Two ways to be at chance. Never learned: after ``min_steps`` steps, the
    median of the last ``window`` losses is within ``tolerance`` of ln(C) and
    none of them went below ``(1 - 2 * tolerance) * ln(C)``; the schedule must
    have let the model learn (the lr has not risen for ``window`` steps: a
    warm-up still climbing from 0 keeps the loss near ln(C) by design), and
    before ``falling_wait`` steps the loss must not be still falling (a deep
    network that starts on a plateau at ln(C) and leaves it a few hundred
    steps in): falling is the window's older half above its newer half by
    more than ``falling_t`` standard errors of the difference of their means.
    Never, once a loss below 0 was seen: a cross-entropy cannot be (REINFORCE's
    loss, over a policy's softmax output, is); an active alert then clears.
    Learned, then lost it: the window's median was below ``learned`` × ln(C)
    and the last ``jump`` losses are all at ln(C) or above (labels that stop
    following the inputs mid-run), and the alert names the first of those
    steps; no schedule or step count is needed, the model has shown it can
    learn. Not when the gradient norm of those steps went over
    ``grad_ratio`` × its median before: that is an optimizer diverging
    (``grad-explosion``), not labels. Either clears when the median of the
    losses since it fired (at least ``jump``, at most ``window``) falls below
    ``(1 - 2 * tolerance) * ln(C)``.
    """

    id = "loss-chance"

    def __init__(
        self,
        classes: int | None = None,
        window: int = 100,
        min_steps: int = 200,
        tolerance: float = 0.1,
        learned: float = 0.5,
        jump: int = 4,
        grad_ratio: float = 20.0,
        falling_t: float = 3.0,
        falling_wait: int = 500,
    ):
        super().__init__()
        self.classes = classes
        self.source = "rules={'loss-chance': {'classes': ...}}" if classes is not None else None
        self.window, self.min_steps, self.tolerance = window, min_steps, tolerance
        self.learned, self.jump, self.grad_ratio = learned, jump, grad_ratio
        self.falling_t, self.falling_wait = falling_t, falling_wait
        self.recent: deque[float] = deque(maxlen=window)
        self.grads: deque[float] = deque(maxlen=window)  # the grad norms of the same steps, when recorded
        self.steps: deque[object] = deque(maxlen=jump)  # the steps of the last `jump` losses
        self.seen = 0
        self.since_fired = 0
        self.low = math.inf  # a lower bound of the window's least loss (exact after each full look)
        # While an episode is active: the losses since it fired (``clears``), kept sorted as they come, so that
        # their median is read, not sorted, at every step of a run that stays at chance.
        self.since: list[float] | None = None
        self.last_lr: float | None = None
        self.peak_lr = 0.0
        self.since_rise = 0  # steps with a known lr since it last rose
        # A cross-entropy is never below 0: a negative loss is something else (REINFORCE's policy-gradient loss,
        # whose policy outputs a (1, actions) softmax), and chance says nothing about it for the rest of the run.
        self.negative = False

    def _push(self, record: Record) -> float | None:
        """The chance-level loss ln(C), once this record's loss is in the window and C is known."""
        # Runs for every step record, on the training process's publisher thread: plain tests, no min()/max().
        if self.classes is None and integer(record.get("classes")) is not None:
            self.classes = record["classes"]
            self.source = "the model's output (its logits' last dimension, or a 2-D output's width)"
        top = top_lr(record)  # the schedule: whether the lr still rises (a warm-up), and its peak
        if top is not None:
            last = self.last_lr
            self.since_rise = 0 if last is not None and top > last else self.since_rise + 1
            self.last_lr = top
            if top > self.peak_lr:
                self.peak_lr = top
        loss = num(record.get("loss"))
        if loss is None or not math.isfinite(loss):
            return None
        recent, since = self.recent, self.since
        dropped = recent[0] if since is not None and len(recent) == recent.maxlen else None
        recent.append(loss)
        self.steps.append(record.get("step"))
        norm = num(record.get("grad_norm"))
        self.grads.append(0.0 if norm is None else norm if math.isfinite(norm) else math.inf)  # 0.0: not recorded
        self.seen += 1
        self.since_fired += 1
        if loss < self.low:
            self.low = loss
            if loss < 0.0:  # (low only ever holds losses seen, so the first negative one comes through here)
                self.negative = True
        if since is not None:
            self._slide(since, loss, dropped)
        classes = self.classes
        if classes is None or classes < 2 or self.negative:
            return None
        return math.log(classes)

    def _settled(self) -> bool:
        """Enough steps, and no lr still rising (a warm-up): a loss near chance would be a fault."""
        return self.seen >= self.min_steps and (self.last_lr is None or self.since_rise >= self.window)

    def _never_learned(self, chance: float) -> bool:
        # Cheapest test first (this runs on every step record): a last loss below the floor is enough to say no.
        floor = (1 - 2 * self.tolerance) * chance
        if self.recent[-1] < floor:
            return False
        if self.low < floor:
            # `low` is the least loss since it was last exact, so at most the window's: only then look at it all.
            self.low = min(self.recent)
            if self.low < floor:
                return False
        return abs(statistics.median(self.recent) - chance) <= self.tolerance * chance

    def _falling(self) -> bool:
        """Whether the window's loss is still going down, before ``falling_wait`` steps: a slow start, not yet
        a fault. Asked only of a window at chance, so its cost (two passes over the window) is rare."""
        if self.seen >= self.falling_wait:
            return False
        values = list(self.recent)
        half = len(values) // 2
        if half < 2:
            return False
        older, newer = values[:half], values[-half:]
        sum_older, sum_newer = sum(older), sum(newer)
        squares = sum(map(operator.mul, older, older)) + sum(map(operator.mul, newer, newer))
        # The variance of the difference of the two means, from sums of squares (float64 has digits to spare for
        # losses near ln C; a window of equal losses may cancel to a hair under 0).
        spread = max(squares - (sum_older * sum_older + sum_newer * sum_newer) / half, 0.0) / ((half - 1) * half)
        fall = (sum_older - sum_newer) / half
        return fall > 0 and fall * fall > self.falling_t * self.falling_t * spread

    def _lost(self, chance: float) -> float | None:
        """The median loss before the last ``jump`` steps, if it was learned and they are all at chance or above."""
        recent, jump = self.recent, self.jump
        bar = (1 - self.tolerance) * chance
        if len(recent) < jump * 6 or recent[-1] < bar or min(recent[-i] for i in range(2, jump + 1)) < bar:
            return None  # the usual answer (a learned loss is under the bar at once), without copying the window
        values = list(recent)
        before = values[:-jump]
        median = statistics.median(before)
        if median >= self.learned * chance:
            return None
        # Gradients that blew up with the loss are a diverging optimizer (grad-explosion's to name), not
        # labels that changed: with shuffled labels they rise a few times, not by grad_ratio.
        grads = list(self.grads)
        usual = statistics.median(grads[: -self.jump]) if len(grads) > self.jump else 0.0
        if usual > 0 and max(grads[-self.jump :]) > self.grad_ratio * usual:
            return None
        return median

    def check(self, record: Record) -> AlertRecord | None:
        chance = self._push(record)
        if chance is None or self.recent[-1] < (1 - 2 * self.tolerance) * chance:
            return None  # the usual answer, a learned loss under both tests' bars, without a call to either
        before = self._lost(chance)
        if before is None and not (self._settled() and self._never_learned(chance) and not self._falling()):
            return None
        self.since_fired = 0
        evidence: dict[str, Any] = {
            "chance": chance,
            "classes": self.classes,
            "classes_from": self.source,
            "schedule": "no lr in the records"
            if self.last_lr is None
            else f"lr {number(self.last_lr, 3)}, not risen for {self.since_rise} steps "
            f"(peak {number(self.peak_lr, 3)})",
        }
        step = record.get("step")
        if before is not None:
            last = list(self.recent)[-self.jump :]
            step = self.steps[0]  # the alert names the step the loss went back to chance at
            message = (
                f"loss went back to chance level ln({self.classes}) = {chance:.3f} or above from this step on, "
                f"{self.jump} steps (from a median of {before:.3f}): the model stopped predicting the labels"
            )
            evidence.update({"loss_before": before, "last_losses": last, "window": len(self.recent) - self.jump})
        else:
            median = statistics.median(self.recent)
            message = (
                f"loss {median:.3f} is at chance level ln({self.classes}) = {chance:.3f} "
                f"(median of the last {len(self.recent)} steps)"
            )
            evidence.update({"loss_median": median, "window": len(self.recent)})
        return alert_record(
            self.id,
            "warning",
            step if isinstance(step, int) else None,
            message,
            evidence,
            "the labels (shuffled? misaligned? a new shard?), the output/loss contract (an extra softmax?), the lr",
        )

    def _suffix(self) -> int:
        """How many of the last losses ``clears`` looks at: those since the alert, at least ``jump``."""
        return min(max(self.since_fired, self.jump), len(self.recent))

    def _slide(self, since: list[float], loss: float, dropped: float | None) -> None:
        """``since`` after ``loss`` came (and ``dropped`` left the full window): the sorted last :meth:`_suffix`.
        The suffix grows by this loss or slides by one (it never shrinks): at most one loss leaves it."""
        bisect.insort(since, loss)
        if len(since) > self._suffix():
            # The oldest of the suffix before this loss: the window's dropped one, or the one just before it.
            oldest = dropped if dropped is not None and len(since) > len(self.recent) else self.recent[-len(since)]
            del since[bisect.bisect_left(since, oldest)]

    def clears(self, record: Record) -> bool:
        if self.since is None:
            self.since = sorted(list(self.recent)[-self._suffix() :]) if self.recent else []
        chance = self._push(record)
        if self.negative:  # not a classifier's loss after all: the alert was not about one
            self.since = None
            return True
        if chance is None:
            return False
        since = self.since
        n = len(since)
        median = since[n // 2] if n % 2 else (since[n // 2 - 1] + since[n // 2]) / 2  # as statistics.median
        cleared = median < (1 - 2 * self.tolerance) * chance
        if cleared:
            self.since = None
        return cleared


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

    A loss over the bar is judged ``confirm`` steps later, and the alert names
    its step: if the median of those next losses is back in the window's range,
    it was one batch (a spike); if they stayed up, the run changed at that step
    (a level shift: new data, labels that no longer follow the inputs, broken
    weights), and the alert says so, and the window starts over from the new
    level. Waiting costs ``confirm`` steps; it keeps a shift to chance level
    from being called one bad batch (loss-chance names that one).
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
        confirm: int = 3,
    ):
        super().__init__()
        self.recent: deque[float] = deque(maxlen=window)
        self.ratio, self.k, self.min_history = ratio, k, min_history
        self.refresh, self.lr_hold, self.confirm = refresh, lr_hold, confirm
        self.bar: float | None = None
        self.ordinary_top = 0.0  # the top of the window's ordinary range
        self.basis: dict[str, float | int | str] = {}
        self.added = 0
        self.last_lr: float | None = None
        self.since_lr_rise = lr_hold
        self.pending: Record | None = None  # the record of a loss over the bar, awaiting its next losses
        self.crossed: dict[str, Any] = {}  # the bar it crossed and the window then: the window moves meanwhile
        self.after: list[float] = []

    def _refresh(self) -> None:
        values = list(self.recent)
        if min(values) >= 0:
            top = max(values)
            self.bar, self.ordinary_top = self.ratio * top, top
            self.basis = {"rule": f"{self.ratio:g} x the window's largest loss", "window_max": top}
        else:
            median = statistics.median(values)
            spread = max(statistics.median(abs(v - median) for v in values) * 1.4826, 0.01 * abs(median))
            self.bar, self.ordinary_top = median + self.k * spread, median + 3 * spread
            self.basis = {"rule": f"median + {self.k:g} x MAD (the loss can be negative)", "mad": spread}
        self.basis["window"] = len(values)

    def _over(self, record: Record) -> bool | None:
        """Whether this record's loss is over the bar; an ordinary loss joins the window. None: no loss."""
        loss = num(record.get("loss"))
        top = top_lr(record)  # a rise by half or more (a warm restart) holds spikes for lr_hold steps
        if top is not None:
            if self.last_lr is not None and top > 1.5 * self.last_lr:
                self.since_lr_rise = 0
            self.last_lr = top
        self.since_lr_rise += 1
        held = self.since_lr_rise <= self.lr_hold
        if loss is None or not math.isfinite(loss):
            return None
        if self.bar is not None and loss > self.bar and not held:
            return True
        self.recent.append(loss)
        self.added += 1
        if len(self.recent) >= self.min_history and (self.bar is None or self.added % self.refresh == 0):
            self._refresh()
        return False

    def check(self, record: Record) -> AlertRecord | None:
        if self.pending is None:
            if self._over(record):
                self.pending, self.after = record, []
                self.crossed = {"median": statistics.median(self.recent), "bar": self.bar, **self.basis}
            return None
        if self._over(record) is None:  # an ordinary loss after the spike still joins the window
            return None
        self.after.append(float(record["loss"]))
        if len(self.after) < self.confirm:
            return None
        spike, self.pending = self.pending, None
        after = statistics.median(self.after)
        shifted = after > self.ordinary_top  # the next losses stayed up: a level shift, not one batch
        found = self._alert(spike, after, shifted)
        if shifted:
            # The run changed at that step: the old window no longer describes its noise. Start over.
            self.recent.clear()
            self.bar, self.added = None, 0
        return found

    def _alert(self, spike: Record, after: float, shifted: bool) -> AlertRecord:
        loss = float(spike["loss"])
        median = self.crossed["median"]
        jumped = (
            f"{number(loss / median, 3)}x its recent median {number(median)}"
            if median > 0
            else f"far above {number(median)}"
        )
        ids = spike.get("batch_ids")
        return alert_record(
            self.id,
            "warning",
            spike.get("step"),
            f"loss {number(loss)} jumped to {jumped}"
            + (f" and stayed up (median {number(after)} over the next {len(self.after)} steps)" if shifted else ""),
            {
                "loss": loss,
                **self.crossed,
                "next_losses": list(self.after),
                "pattern": "level shift from this step" if shifted else "one batch",
                "batch_ids": ids[:64] if isinstance(ids, list) else None,
            },
            "what changed at this step: the data (units, labels, a new shard) or the lr; this batch is in the dump"
            if shifted
            else "look at this batch (its ids are in the evidence and its tensors in the dump), then the lr",
        )

    def clears(self, record: Record) -> bool:
        # A spike is one step: ordinary losses end it. After a level shift nothing is ordinary until the new
        # level has its own window (a diverging loss would otherwise re-arm and fire every 30 steps).
        return self._over(record) is False and self.bar is not None


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
            f"eval loss rose {self.rises} times in a row to {number(value)} (best {number(best)}) "
            f"while the training loss fell to {number(train)} (from {number(train_at_best)})",
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
