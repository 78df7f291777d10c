"""What every rule shares: its thresholds, its alert records, and fire-once-per-episode."""

from __future__ import annotations

from tuiwatch.ledger.fields import num
from tuiwatch.ledger.records import AlertRecord, Record, alert_record

_last_top: tuple[object, float | None] = (None, None)  # the last lr list seen and its top: several rules ask


def top_lr(record: Record) -> float | None:
    """The largest learning rate of a step record's param groups (None when it has none)."""
    global _last_top
    lr, last = record.get("lr"), _last_top  # one read: another thread may replace it meanwhile
    if lr is last[0]:  # the same list object (the cache holds it, so its id cannot be reused)
        return last[1]
    if not isinstance(lr, list):
        top = None
    elif len(lr) == 1:  # one param group (the usual): no generator; each record brings a new list
        only = num(lr[0])
        top = None if only is None else abs(only)
    else:
        top = max((abs(v) for v in map(num, lr) if v is not None), default=None)
    _last_top = (lr, top)
    return top


class Learned:
    """Whether the run has had something to learn from: a loss or a gradient norm other than 0 since its first step
    record, or a first step record that is not step 0 (a resumed run, or one watched from mid-run: its start unseen).

    Zero gradients of a loss of exactly 0 are then a loss at its floor (a solved task, a sample fitted exactly), not
    a loss that never depended on the model (grad-zero, loss-frozen).
    """

    def __init__(self) -> None:
        self.yes: bool | None = None  # None until the first step record

    def see(self, record: Record) -> None:
        if self.yes is None:
            self.yes = record.get("step") != 0
        norm, loss = record.get("grad_norm"), record.get("loss")
        if (loss is not None and loss != 0) or (norm is not None and norm != 0):
            self.yes = True


class Rule:
    """A rule watches the record stream through a bounded window and speaks when its condition starts.

    Subclasses implement :meth:`check`, returning an alert record when the
    condition holds at this record (None otherwise). The base class turns that
    into one alert per episode, and an ``info`` alert when the episode ends.
    """

    id = ""
    kinds: tuple[str, ...] = ("step",)
    # Records in a row that must look clear before an episode ends: a rule
    # whose condition flickers (a diverging loss spikes every few steps) then
    # speaks once, not at every flicker.
    clear_after = 1

    def __init__(self) -> None:
        self.active = False
        self.calm = 0

    def check(self, record: Record) -> AlertRecord | None:
        raise NotImplementedError

    def clears(self, record: Record) -> bool:
        """Whether this record ends an active episode (default: the condition no longer holds)."""
        return self.check(record) is None

    def observe(self, record: Record) -> AlertRecord | None:
        if self.active:
            self.calm = self.calm + 1 if self.clears(record) else 0
            if self.calm >= self.clear_after:
                self.active = False
                self.calm = 0
                return alert_record(self.id, "info", record.get("step"), f"{self.id} cleared", {}, "")
            return None
        found = self.check(record)
        if found is not None:
            self.active = True
        return found
