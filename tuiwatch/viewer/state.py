"""The run as the viewer knows it: a fold of ledger records. Pure: no Textual, no I/O.

Every pane reads from one :class:`RunState`; the app applies records to it as
they arrive and asks the panes to redraw. Memory is bounded whatever the
run's length: series are decimated, alerts and actions are capped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from tuiwatch.analysis.format import size
from tuiwatch.ledger.records import RESERVED_METRIC_NAMES, Record
from tuiwatch.viewer.render.series import Series

# Fields of a step record that are not user metrics.
_STEP_INTERNAL = RESERVED_METRIC_NAMES
MAX_ALERTS = 200
MAX_METRICS = 32  # distinct user metrics charted; more are counted, not kept


@dataclass
class Alert:
    """One line of the alert pane: an alert record, or a command's fate."""

    severity: str
    step: int | None
    rule: str
    message: str
    next_check: str = ""
    t: float = 0.0
    dump: str = ""  # the dump directory the alert's evidence names


def describe_action(r: Record, action: str) -> str:
    """The line a command's reply is shown as (alert pane and notification)."""
    if r.get("ok") is not True:
        return f"{action} failed: {r.get('error') or 'no reason given'}"
    path, done = r.get("path"), r.get("steps_done")
    if action == "checkpoint" and path:
        n_bytes = r.get("bytes")
        if not (is_number(n_bytes) and is_number(done)):
            return f"checkpoint written: {path}"
        return f"checkpoint written: {path} ({size(n_bytes)}, step {done})"
    if action == "dump" and path:
        return f"dump written: {path}"
    if action == "stop":
        final = f"; final checkpoint {path}" if path else f"; no checkpoint: {r.get('checkpoint_error')}"
        return f"stop requested{final}"
    if action == "pause":
        return f"paused after step {r.get('step')}"
    return f"{action} done" + (f": {path}" if path else "")


@dataclass
class PendingCommand:
    cmd: str
    sent: float


@dataclass
class RunState:
    run: Record = field(default_factory=dict)
    status: str = "connecting"
    end_reason: str | None = None
    step: int | None = None
    epoch: int | None = None
    first_t: float | None = None
    last_t: float | None = None
    last_step: Record = field(default_factory=dict)
    last_eval: Record = field(default_factory=dict)
    last_system: Record = field(default_factory=dict)
    publisher: Record = field(default_factory=dict)
    metrics: dict[str, Series] = field(default_factory=dict)
    eval_metrics: dict[str, Series] = field(default_factory=dict)
    lr: Series = field(default_factory=Series)
    grad_norm: Series = field(default_factory=Series)
    data_wait: Series = field(default_factory=Series)
    compute: Series = field(default_factory=Series)
    mem_allocated: Series = field(default_factory=Series)
    rss: Series = field(default_factory=Series)
    alerts: deque[Alert] = field(default_factory=lambda: deque(maxlen=MAX_ALERTS))
    pending: dict[int, PendingCommand] = field(default_factory=dict)
    records: int = 0
    dropped_metrics: int = 0

    # --- folding -----------------------------------------------------------------

    def apply(self, record: Record) -> None:
        self.records += 1
        kind = record.get("kind")
        t = record.get("t")
        if isinstance(t, int | float):
            self.first_t = self.first_t if self.first_t is not None else float(t)
            self.last_t = float(t)
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is not None:
            handler(self, record)

    def apply_all(self, records: Iterable[Record]) -> None:
        for record in records:
            self.apply(record)

    def _run(self, r: Record) -> None:
        self.run = r
        self.status = "live"
        self.end_reason = None

    def _step(self, r: Record) -> None:
        step = r.get("step")
        if not isinstance(step, int):
            return
        self.step = step
        self.epoch = r.get("epoch") if isinstance(r.get("epoch"), int) else self.epoch
        self.last_step = r
        for name, value in r.items():
            if name in _STEP_INTERNAL or not is_number(value):
                continue
            series = self.metrics.get(name)
            if series is None:
                if len(self.metrics) >= MAX_METRICS:
                    self.dropped_metrics += 1
                    continue
                series = self.metrics[name] = Series()
            series.add(step, float(value))
        lr = r.get("lr")
        if isinstance(lr, list) and lr and is_number(lr[0]):
            self.lr.add(step, float(lr[0]))
        for series, key in (
            (self.grad_norm, "grad_norm"),
            (self.data_wait, "data_wait_s"),
            (self.compute, "compute_s"),
            (self.mem_allocated, "mem_allocated"),
        ):
            value = r.get(key)
            if is_number(value):
                series.add(step, float(value))

    def _eval(self, r: Record) -> None:
        step = r.get("step")
        if not isinstance(step, int):
            return
        self.last_eval = r
        for name, value in r.items():
            if name in ("kind", "t", "step", "epoch", "training") or not is_number(value):
                continue
            series = self.eval_metrics.get(name)
            if series is None:
                if len(self.eval_metrics) >= MAX_METRICS:
                    continue
                series = self.eval_metrics[name] = Series()
            series.add(step, float(value))

    def _system(self, r: Record) -> None:
        self.last_system = r
        rss = r.get("rss")
        if is_number(rss) and self.step is not None:
            self.rss.add(self.step, float(rss))

    def _publisher(self, r: Record) -> None:
        self.publisher = r
        if r.get("status") == "degraded" and self.status == "live":
            self.status = "degraded"

    def _alert(self, r: Record) -> None:
        self.alerts.appendleft(
            Alert(
                severity=str(r.get("severity", "info")),
                step=r.get("step") if isinstance(r.get("step"), int) else None,
                rule=str(r.get("rule", "")),
                message=str(r.get("message", "")),
                next_check=str(r.get("next_check") or ""),
                t=float(r["t"]) if is_number(r.get("t")) else 0.0,
                dump=str(evidence.get("dump") or "") if isinstance(evidence := r.get("evidence"), dict) else "",
            )
        )

    def _action(self, r: Record) -> None:
        cmd_id = r.get("id")
        pending = self.pending.pop(cmd_id, None) if isinstance(cmd_id, int) else None
        action = str(r.get("action") or (pending.cmd if pending else "command"))
        ok = r.get("ok") is True
        message = describe_action(r, action)
        self.alerts.appendleft(
            Alert("info" if ok else "warning", r.get("step") if isinstance(r.get("step"), int) else None,
                  "command", message)
        )  # fmt: skip
        if ok and action == "pause":
            self.status = "paused"
        elif ok and action == "resume":
            self.status = "live"

    def _end(self, r: Record) -> None:
        self.end_reason = str(r.get("reason", "finished"))
        self.status = "stopped" if self.end_reason == "stopped" else "finished"

    # --- events from the source and the user -------------------------------------

    def disconnected(self) -> None:
        if self.status not in ("finished", "stopped"):
            self.status = "disconnected"

    def command_sent(self, cmd_id: int, cmd: str, now: float | None = None) -> None:
        self.pending[cmd_id] = PendingCommand(cmd, time.time() if now is None else now)
        self.alerts.appendleft(Alert("info", self.step, "command", f"{cmd} sent, waiting for the next step boundary"))

    # --- derived values ----------------------------------------------------------

    @property
    def name(self) -> str:
        return str(self.run.get("name") or "?")

    def elapsed(self, now: float | None = None) -> float | None:
        started = self.run.get("t", self.first_t)
        if not is_number(started):
            return None
        end = self.last_t if self.status in ("finished", "stopped", "disconnected") or now is None else now
        return None if end is None else float(end) - float(started)

    def train_metric(self) -> str | None:
        """The metric to chart as 'loss': ``loss`` if logged, else the first one."""
        if "loss" in self.metrics:
            return "loss"
        return next(iter(self.metrics), None)

    def eval_metric(self) -> str | None:
        for name in ("val_loss", "eval_loss", "loss"):
            if name in self.eval_metrics:
                return name
        return next((n for n in self.eval_metrics if "loss" in n), None)


def is_number(value: Any) -> TypeGuard[float]:
    return type(value) is float or type(value) is int  # bool is not a number here


_HANDLERS = {
    "run": RunState._run,
    "step": RunState._step,
    "eval": RunState._eval,
    "system": RunState._system,
    "publisher": RunState._publisher,
    "alert": RunState._alert,
    "action": RunState._action,
    "end": RunState._end,
}
