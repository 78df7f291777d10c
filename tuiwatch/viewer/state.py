"""The run as the viewer knows it: a fold of ledger records. Pure: no Textual, no I/O.

The app applies records to one :class:`RunState` as they arrive;
:mod:`tuiwatch.viewer.views` turns it into one frozen view per pane. Memory is
bounded whatever the run's length: series are decimated, alerts are capped.
Every field of a record is read through :mod:`tuiwatch.ledger.fields`: a
ledger may come from anywhere.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tuiwatch.analysis.format import json_text, size
from tuiwatch.ledger.fields import integer, is_number, num
from tuiwatch.ledger.records import EVAL_FIELDS, RESERVED_METRIC_NAMES, Record
from tuiwatch.rules import REGISTRY
from tuiwatch.viewer.render.series import Series

MAX_ALERTS = 200
MAX_EVIDENCE = 20_000  # characters of an alert's evidence kept to show (its batch ids are cut at 64 already)
MAX_METRICS = 32  # distinct user metrics charted; more are not kept
MAX_GPUS = 8  # NVML series kept for the metrics view: a node's GPUs
LIVE_STATUSES = ("live", "paused", "degraded", "connecting")
ENDED = ("finished", "stopped", "failed")  # the run wrote its end record


@dataclass(frozen=True)
class Alert:
    """One line of the alert pane: an alert record, or a command's fate."""

    severity: str
    step: int | None
    rule: str
    message: str
    next_check: str = ""
    t: float = 0.0
    dump: str = ""  # the dump directory the alert's evidence names
    samples: tuple[int, ...] = ()  # the ids of the batch's samples that hold NaN/inf, when the run found them
    rank: int | None = None  # the rank that saw it, in a job of several
    evidence: str = ""  # the record's evidence as indented JSON, for the alert's own screen (enter)


def end_status(reason: str) -> str:
    """The status an end record's reason gives: "stopped" is a stop someone asked for; any other reason but
    "finished" is the run failing."""
    return {"finished": "finished", "stopped": "stopped"}.get(reason, "failed")


def describe_action(r: Record, action: str) -> str:
    """The line a command's reply is shown as (alert pane and notification)."""
    rank_steps = r.get("rank_steps")
    if isinstance(rank_steps, dict) and r.get("ok") is True:
        # First, where a long path would cut it off: whether every rank acted, and at one step.
        return _where(rank_steps) + _describe_one(r, action)
    return _describe_one(r, action)


def _where(rank_steps: dict[str, object]) -> str:
    """Where a command sent to every rank ran: one step for all, or each rank's."""
    steps = set(rank_steps.values())
    if len(steps) == 1:
        return f"{len(rank_steps)} ranks after step {steps.pop()}: "
    each = ", ".join(f"rank {k} after step {v}" for k, v in rank_steps.items())
    return f"{len(rank_steps)} ranks NOT at one step ({each}): "


def _describe_one(r: Record, action: str) -> str:
    if r.get("ok") is not True:
        return f"{action} failed: {r.get('error') or 'no reason given'}"
    path, done = r.get("path"), integer(r.get("steps_done"))
    if action == "checkpoint" and path:
        n_bytes = r.get("bytes")
        if not is_number(n_bytes) or done is None:
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
class RunState:
    run: Record = field(default_factory=dict)
    status: str = "connecting"
    end_reason: str | None = None
    step: int | None = None
    epoch: int | None = None
    first_t: float | None = None
    last_t: float | None = None
    last_step: Record = field(default_factory=dict)
    last_system: Record = field(default_factory=dict)
    metrics: dict[str, Series] = field(default_factory=dict)
    eval_metrics: dict[str, Series] = field(default_factory=dict)
    lr: Series = field(default_factory=Series)
    grad_norm: Series = field(default_factory=Series)
    data_wait: Series = field(default_factory=Series)
    compute: Series = field(default_factory=Series)
    mem_allocated: Series = field(default_factory=Series)
    rss: Series = field(default_factory=Series)
    # Only the metrics view (m) draws these.
    param_norm: Series = field(default_factory=Series)
    update_norm: Series = field(default_factory=Series)
    update_ratio: Series = field(default_factory=Series)  # update norm / param norm, where a step has both
    throughput: Series = field(default_factory=Series)  # examples_per_s
    gpus: dict[str, Series] = field(default_factory=dict)  # "gpu0 util", "gpu0 memory": NVML readings by step
    alerts: deque[Alert] = field(default_factory=lambda: deque(maxlen=MAX_ALERTS))
    # Commands this viewer sent, by id, until their reply comes; replies land in ``answered``.
    pending: dict[int, str] = field(default_factory=dict)
    answered: list[Record] = field(default_factory=list)

    # --- folding -----------------------------------------------------------------

    def apply(self, record: Record) -> None:
        t = num(record.get("t"))
        if t is not None:
            self.first_t = self.first_t if self.first_t is not None else t
            self.last_t = t
        kind = record.get("kind")
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

    def _resumed(self, r: Record) -> None:
        # watch.restore() or a framework's resume (Lightning, the Trainer) links back here, not in the run
        # record: the run's info shows it all the same.
        link = r.get("resumed_from")
        if isinstance(link, Mapping) and not isinstance(self.run.get("resumed_from"), Mapping):
            self.run = {**self.run, "resumed_from": link}

    def _step(self, r: Record) -> None:
        step = integer(r.get("step"))
        if step is None:
            return
        self.step = step
        epoch = integer(r.get("epoch"))
        self.epoch = epoch if epoch is not None else self.epoch
        self.last_step = r
        _add_metrics(self.metrics, r, RESERVED_METRIC_NAMES, step)
        lr = r.get("lr")
        if isinstance(lr, list) and lr and is_number(lr[0]):
            self.lr.add(step, float(lr[0]))
        for series, key in (
            (self.grad_norm, "grad_norm"),
            (self.data_wait, "data_wait_s"),
            (self.compute, "compute_s"),
            (self.mem_allocated, "mem_allocated"),
            (self.param_norm, "param_norm"),
            (self.update_norm, "update_norm"),
            (self.throughput, "examples_per_s"),
        ):
            value = num(r.get(key))
            if value is not None:
                series.add(step, value)
        update, param = num(r.get("update_norm")), num(r.get("param_norm"))
        if update is not None and param:
            self.update_ratio.add(step, update / param)

    def _eval(self, r: Record) -> None:
        step = integer(r.get("step"))
        if step is not None:
            _add_metrics(self.eval_metrics, r, EVAL_FIELDS, step)

    def _system(self, r: Record) -> None:
        self.last_system = r
        rss = num(r.get("rss"))
        if self.step is None:
            return
        if rss is not None:
            self.rss.add(self.step, rss)
        gpus = r.get("gpus")
        for gpu in gpus[:MAX_GPUS] if isinstance(gpus, list) else ():
            index = integer(gpu.get("index")) if isinstance(gpu, dict) else None
            if index is None:
                continue
            for what, key in (("util", "util"), ("memory", "mem_used")):
                value = num(gpu.get(key))
                if value is not None:
                    self.gpus.setdefault(f"gpu{index} {what}", Series()).add(self.step, value)

    def _publisher(self, r: Record) -> None:
        if r.get("status") == "degraded" and self.status == "live":
            self.status = "degraded"

    def _alert(self, r: Record) -> None:
        evidence = r.get("evidence")
        self._insert(
            Alert(
                severity=str(r.get("severity", "info")),
                step=integer(r.get("step")),
                rule=str(r.get("rule", "")),
                message=str(r.get("message", "")),
                next_check=str(r.get("next_check") or ""),
                t=num(r.get("t")) or 0.0,
                dump=str(evidence.get("dump") or "") if isinstance(evidence, dict) else "",
                samples=_ids(evidence.get("nonfinite_sample_ids")) if isinstance(evidence, dict) else (),
                rank=integer(r.get("rank")),
                evidence=json_text(evidence)[:MAX_EVIDENCE] if isinstance(evidence, dict) else "",
            )
        )

    def _insert(self, alert: Alert) -> None:
        """Newest step first; among alerts about one step, the first link of the chain on top.

        A rule may name an earlier step than the last one (loss-spike judges a
        loss 3 steps later): it goes where its step is, and at one step the
        cause (loss-chance) stays above its symptom (loss-spike).
        """
        key = _order(alert)
        at = next((i for i, a in enumerate(self.alerts) if _order(a) >= key), len(self.alerts))
        if len(self.alerts) == self.alerts.maxlen and at == len(self.alerts):
            return  # older than everything kept
        self.alerts.insert(at, alert)

    def _action(self, r: Record) -> None:
        cmd_id = integer(r.get("id"))
        sent = self.pending.pop(cmd_id, None) if cmd_id is not None else None
        if sent is not None:
            self.answered.append(r)
        action = str(r.get("action") or sent or "command")
        ok = r.get("ok") is True
        severity = "info" if ok and r.get("apart") is not True else "warning"
        self.alerts.appendleft(Alert(severity, integer(r.get("step")), "command", describe_action(r, action)))
        if ok and action == "pause":
            self.status = "paused"
        elif ok and action == "resume":
            self.status = "live"

    def _end(self, r: Record) -> None:
        self.end_reason = str(r.get("reason", "finished"))
        self.status = end_status(self.end_reason)

    # --- events from the source and the user -------------------------------------

    def disconnected(self) -> None:
        if self.status not in ENDED:
            self.status = "disconnected"

    def command_sent(self, cmd_id: int, cmd: str, said: str | None = None) -> None:
        self.pending[cmd_id] = cmd
        said = said or f"{cmd} sent, waiting for the next step boundary"
        self.alerts.appendleft(Alert("info", self.step, "command", said))

    def take_answered(self) -> list[Record]:
        """The replies to this viewer's commands that arrived since the last call."""
        answered, self.answered = self.answered, []
        return answered

    # --- derived values ----------------------------------------------------------

    @property
    def name(self) -> str:
        return str(self.run.get("name") or "?")

    @property
    def live(self) -> bool:
        """Whether the run may still take commands."""
        return self.status in LIVE_STATUSES

    def elapsed(self, now: float | None = None) -> float | None:
        started = num(self.run.get("t"))
        started = started if started is not None else self.first_t
        if started is None:
            return None
        end = self.last_t if self.status in (*ENDED, "disconnected") or now is None else now
        return None if end is None else end - started


# Where each rule sits in the chain data → model → loss → gradients → optimizer → parameters.
_CHAIN = {rule: i for i, rule in enumerate(REGISTRY)}


def _order(alert: Alert) -> tuple[float, int]:
    """Sort key of the alert pane (ascending = higher up): a later step first, then the earlier link."""
    step = float("inf") if alert.step is None else alert.step
    return (-step, _CHAIN.get(alert.rule, len(_CHAIN)))


def _ids(value: object) -> tuple[int, ...]:
    return tuple(i for i in value[:64] if type(i) is int) if isinstance(value, list) else ()


def _add_metrics(series: dict[str, Series], r: Record, skip: Iterable[str], step: int) -> None:
    for name, value in r.items():
        if name in skip or not is_number(value):
            continue
        line = series.get(name)
        if line is None:
            if len(series) >= MAX_METRICS:
                continue
            line = series[name] = Series()
        line.add(step, float(value))


_HANDLERS = {
    "run": RunState._run,
    "resumed": RunState._resumed,
    "step": RunState._step,
    "eval": RunState._eval,
    "system": RunState._system,
    "publisher": RunState._publisher,
    "alert": RunState._alert,
    "action": RunState._action,
    "end": RunState._end,
}
