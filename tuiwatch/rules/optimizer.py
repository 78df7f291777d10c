"""The optimizer: a learning rate at zero, or gradients that move no parameter."""

from __future__ import annotations

import math

from tuiwatch.ledger.fields import num
from tuiwatch.ledger.numbers import number
from tuiwatch.ledger.records import AlertRecord, Record, alert_record
from tuiwatch.rules.base import Rule, top_lr


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
        self._last: tuple[list[object], bool | None] | None = None  # the last lrs and their answer

    def _zero(self, record: Record) -> bool | None:
        lr = record.get("lr")
        if record.get("opt_step") is None or not isinstance(lr, list) or not lr:
            return None
        last = self._last
        if last is not None and lr == last[0]:
            return last[1]  # the same lrs as the step before (most steps): the same peaks, the same answer
        answer = self._zero_of(lr)
        self._last = (lr, answer)
        return answer

    def _zero_of(self, lr: list[object]) -> bool | None:
        values = [num(v) for v in lr]
        if any(v is None for v in values):
            return None
        if len(self.peak) != len(values):
            self.peak = [0.0] * len(values)
        self.peak = [max(p, abs(v or 0.0)) for p, v in zip(self.peak, values, strict=True)]
        return all(v == 0 or abs(v or 0.0) <= self.collapse * p for v, p in zip(values, self.peak, strict=True))

    def check(self, record: Record) -> AlertRecord | None:
        zero = self._zero(record)
        if zero is None:
            return None
        self.run = self.run + 1 if zero else 0
        if self.run < self.steps:
            return None
        lr = record.get("lr")
        collapsed = any(v != 0 for v in lr or ())
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"learning rate is {'collapsed to ' + str(lr) if collapsed else '0'} for {self.run} optimizer steps"
            + (f" (it was {self.peak})" if collapsed else ""),
            {"lr": lr, "peak_lr": list(self.peak), "steps": self.run},
            "read the schedule (warm-up, decay, step size; scheduler.step() once per epoch or per batch?)",
        )

    def clears(self, record: Record) -> bool:
        if self._zero(record) is False:
            self.run = 0
            return True
        return False


class NoUpdate(Rule):
    """Gradients arrive but the parameters do not move: the optimizer steps something else, or nothing.

    Two signals, either suffices: the sampled ``update_norm`` is exactly 0 on
    ``samples`` measured steps in a row, or ``param_norm`` is bit-identical over
    ``steps`` optimizer steps (counted between its samples: it is measured every
    10th step by default); both only while the grad norm is positive and
    the expected step (lr × grad norm) is above ``resolution`` × the parameter
    norm, which float32 weights can register. A run whose every lr is 0 is
    left to ``lr-zero``, which names the cause.
    """

    id = "no-update"

    def __init__(self, samples: int = 3, steps: int = 20, lr_fallen: float = 1e-3, resolution: float = 1e-5):
        super().__init__()
        self.samples, self.steps, self.lr_fallen, self.resolution = samples, steps, lr_fallen, resolution
        self.zero_updates = 0
        self.same_params = 0  # optimizer steps over which the sampled param norm stayed bit-identical
        self.last_param: tuple[float, int] | None = None  # the last sampled param norm and its optimizer step
        self.peak_lr = 0.0

    def _still(self, record: Record) -> bool | None:
        """Whether this optimizer step left the parameters where they were (None: nothing to say)."""
        grad = num(record.get("grad_norm"))
        if record.get("opt_step") is None or record.get("opt_skipped") or not grad or not math.isfinite(grad):
            return None
        top = top_lr(record)  # None: no lr known
        if top == 0:
            return None
        if top is not None and top > self.peak_lr:
            self.peak_lr = top
        update, param = num(record.get("update_norm")), num(record.get("param_norm"))
        # A step of about lr x grad norm that float32 cannot even register on the weights
        # (a converged model at the end of a decay) is not "no update".
        if top is not None and param and top * grad < self.resolution * param:
            return None
        if update is not None:
            self.zero_updates = self.zero_updates + 1 if update == 0 else 0
        if param is not None:
            opt_step = num(record.get("opt_step")) or 0
            last = self.last_param
            self.same_params = self.same_params + int(opt_step - last[1]) if last and param == last[0] else 0
            self.last_param = (param, int(opt_step))
        return self.zero_updates >= self.samples or self.same_params >= self.steps

    def check(self, record: Record) -> AlertRecord | None:
        if not self._still(record):
            return None
        lr = record.get("lr")
        top = top_lr(record)
        fallen = top is not None and top <= self.lr_fallen * self.peak_lr
        message = (
            f"gradients are nonzero (norm {number(record.get('grad_norm'), 3)}) but the parameters do not change "
            f"(update norm {record.get('update_norm')}, param norm {record.get('param_norm')})"
        )
        if fallen:
            message += f"; the lr fell to {number(top, 3)} from {number(self.peak_lr, 3)}"
        return alert_record(
            self.id,
            "critical",
            record.get("step"),
            message,
            {
                "grad_norm": record.get("grad_norm"),
                "update_norm": record.get("update_norm"),
                "param_norm": record.get("param_norm"),
                "lr": lr,
                "peak_lr": self.peak_lr,
                "zero_updates": self.zero_updates,
                "same_param_steps": self.same_params,
            },
            "read the schedule: the lr is too small to move the weights"
            if fallen
            else "the optimizer holds other parameters (built on a copy?), the lr is 0, or the parameters are frozen",
        )

    def clears(self, record: Record) -> bool:
        return self._still(record) is False
