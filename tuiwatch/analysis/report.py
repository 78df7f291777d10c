"""``tuiwatch report``: a plain summary of a ledger, for logs and CI. Pure: no torch, no Textual."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Any

from tuiwatch.analysis.format import duration, number, rules_text, safe, size
from tuiwatch.ledger.chain import RunChain
from tuiwatch.ledger.fields import finite, integer, num
from tuiwatch.ledger.records import EVAL_FIELDS, Record
from tuiwatch.rules import Diagnosis
from tuiwatch.rules.values import handled_batch

# Replayed alerts kept at most: a pathological ledger must not grow the report without bound.
MAX_REPLAYED = 10_000
LOSS_WINDOW = 100  # "best loss" is the best mean of this many consecutive steps, not one lucky batch


def summarize(records: Iterable[Record], skipped: int = 0, chain: RunChain | None = None) -> dict[str, Any]:
    """The summary of a run, in one pass over ``records`` (streamed: memory does not grow with the run).

    Alerts are those in the ledger plus those the rules find on replay. Given
    the ``chain`` of a resumed run (``read_run``), ``records`` are its
    records, earlier parts included (``chain.iter_records()``), and the
    summary says where it resumed; its unreadable lines are counted as read.
    """
    diagnosis: Diagnosis | None = None
    recorded: set[tuple[str, int | None]] = set()
    replayed: list[Record] = []
    summary = _Summary()
    for r in records:
        if diagnosis is None:
            diagnosis = _replaying(r)
        if r.get("kind") == "alert":
            recorded.add(_alert_key(r))
        elif len(replayed) < MAX_REPLAYED:
            replayed += diagnosis.feed(r)
        summary.add(r)
    for alert in replayed:
        if _alert_key(alert) not in recorded:
            # Made now, not in the run: its time would stretch the run's length to today (a ledger without the
            # alert its rules raise: a run killed before it was written, a version that did not have the rule).
            summary.add({**alert, "t": None})
    out = summary.result(chain.skipped if chain is not None else skipped)
    out["resumed"] = [] if chain is None else _resumes(chain)
    return out


def _replaying(first: Record) -> Diagnosis:
    """The rules the run itself ran (its run record's ``rules``): one it turned off is not replayed."""
    rules = first.get("rules") if first.get("kind") == "run" else None
    try:
        return Diagnosis(rules)
    except (TypeError, ValueError):  # a record this version cannot read as rules (an older or a newer one)
        return Diagnosis()


def _resumes(chain: RunChain) -> list[dict[str, Any]]:
    """Each resume of the chain, oldest first: the step, the checkpoint, and whether the earlier part was read."""
    found = len(chain.parts) - 1  # the newest `found` links have their earlier part in the report
    out = []
    for i, link in enumerate(reversed(chain.links)):
        missing = i < len(chain.links) - found
        out.append(
            {
                "step": integer(link.get("step")),
                "checkpoint": link.get("checkpoint"),
                "name": link.get("name"),
                "ledger": link.get("ledger"),
                "earlier_part": None if missing else link.get("ledger"),
                "missing": chain.missing if missing else None,
            }
        )
    return out


def lower_is_better(name: str) -> bool | None:
    """An eval metric's direction, from its name: a loss or an error falls, an accuracy rises; else unknown."""
    low = name.lower()
    if any(k in low for k in ("loss", "err", "perplexity", "ppl", "mse", "mae", "wer", "cer")):
        return True
    if any(k in low for k in ("acc", "f1", "auc", "bleu", "rouge", "precision", "recall", "iou", "dice", "map")):
        return False
    return None


MAX_EVAL_METRICS = 32


class _Summary:
    """What a report says, folded one record at a time."""

    def __init__(self) -> None:
        self.run: Record = {}
        self.end: Record | None = None
        self.steps = self.evals = self.nonfinite_steps = self.handled_steps = self.missing = 0
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.final_loss: float | None = None
        self.window: deque[float] = deque(maxlen=LOSS_WINDOW)
        self.window_sum = 0.0
        self.best: tuple[float, int | None] | None = None  # (mean of a full window, its last step)
        self.min_loss: float | None = None
        self.wait = self.compute = 0.0
        self.peak_mem: float | None = None
        self.peak_rss: float | None = None
        self.alerts: dict[str, dict[str, Any]] = {}
        self.eval_metrics: dict[str, dict[str, Any]] = {}

    def add(self, r: Record) -> None:
        kind = r.get("kind")
        t = num(r.get("t"))
        if t is not None:
            self.first_t = t if self.first_t is None else self.first_t
            self.last_t = t
        if kind == "run":
            self.run = r
        elif kind == "step":
            self._step(r)
        elif kind == "eval":
            self.evals += 1
            self._eval(r)
        elif kind == "system":
            rss = num(r.get("rss"))
            if rss is not None:
                self.peak_rss = max(self.peak_rss or 0, rss)
        elif kind == "alert" and r.get("severity") != "info":
            rule = str(r.get("rule"))
            entry = self.alerts.setdefault(
                rule, {"count": 0, "first_step": _alert_key(r)[1], "severity": str(r.get("severity"))}
            )
            entry["count"] += 1
        elif kind == "gap":
            lost = integer(r.get("records"))
            self.missing += lost if lost is not None and lost > 0 else 0
        elif kind == "end":
            self.end = r

    def _step(self, r: Record) -> None:
        self.steps += 1
        loss = num(r.get("loss"))
        if loss is not None:
            self.final_loss = loss
            if math.isfinite(loss):
                self.min_loss = loss if self.min_loss is None else min(self.min_loss, loss)
                if len(self.window) == self.window.maxlen:
                    self.window_sum -= self.window[0]
                self.window.append(loss)
                self.window_sum += loss
                if len(self.window) == self.window.maxlen:
                    mean = self.window_sum / len(self.window)
                    if self.best is None or mean < self.best[0]:
                        self.best = (mean, integer(r.get("step")))
        step_wait, step_compute = finite(r.get("data_wait_s")), finite(r.get("compute_s"))
        if step_wait is not None and step_compute is not None:
            # Only steps where the wait was measured: a loop without batches()/fetching() has none.
            self.wait += step_wait
            self.compute += step_compute
        peak = num(r.get("mem_peak"))
        if peak is not None:
            self.peak_mem = max(self.peak_mem or 0, peak)
        flags = r.get("finite")
        if isinstance(flags, dict) and False in flags.values():
            if handled_batch(flags):
                self.handled_steps += 1
            else:
                self.nonfinite_steps += 1

    def _eval(self, r: Record) -> None:
        step = integer(r.get("step"))
        for name, value in r.items():
            v = finite(value)
            if name in EVAL_FIELDS or v is None or isinstance(value, bool):
                continue
            entry = self.eval_metrics.get(name)
            if entry is None:
                if len(self.eval_metrics) >= MAX_EVAL_METRICS:
                    continue
                entry = self.eval_metrics[name] = {"lower_is_better": lower_is_better(name), "count": 0}
            entry["count"] += 1
            entry["last"], entry["last_step"] = v, step
            lower = entry["lower_is_better"]
            if lower is not None and ("best" not in entry or (v < entry["best"] if lower else v > entry["best"])):
                entry["best"], entry["best_step"] = v, step

    def result(self, skipped: int) -> dict[str, Any]:
        total = self.wait + self.compute
        best = self.best
        if best is None and self.window:
            best = (self.window_sum / len(self.window), None)  # a run shorter than the window: its mean
        return {
            "name": self.run.get("name"),
            "run_id": self.run.get("run_id"),
            "steps": self.steps,
            "evals": self.evals,
            "duration_s": None if self.first_t is None or self.last_t is None else self.last_t - self.first_t,
            "final_loss": self.final_loss,
            "final_loss_mean": self.window_sum / len(self.window) if self.window else None,
            "best_loss": None if best is None else best[0],
            "best_step": None if best is None else best[1],
            "loss_window": LOSS_WINDOW,
            "min_loss": self.min_loss,
            "eval_metrics": self.eval_metrics,
            "data_wait_share": self.wait / total if total > 0 else None,
            "peak_mem_bytes": self.peak_mem,
            "peak_rss_bytes": self.peak_rss,
            "nonfinite_steps": self.nonfinite_steps,
            "handled_batch_steps": self.handled_steps,
            "alerts": self.alerts,
            "rules": rules_text(self.run.get("rules"), self.run.get("rules_note")),
            "end": None if self.end is None else self.end.get("reason"),
            "skipped_lines": skipped,
            "missing_records": self.missing,
        }


def _alert_key(r: Record) -> tuple[str, int | None]:
    return str(r.get("rule")), integer(r.get("step"))


def _share_text(share: float | None, steps: int) -> str:
    if share is not None:
        return f"{share:.1%} of step time"
    return "not measured (no watch.batches() or watch.fetching() in the loop)" if steps else "-"


def _step(step: Any) -> str:
    return "-" if step is None else str(step)


def _loss_text(summary: dict[str, Any]) -> str:
    window, steps = summary["loss_window"], summary["steps"]
    if summary["final_loss"] is None:
        return "loss       -"
    if summary["best_step"] is None:  # a run shorter than the window
        return f"loss       final {number(summary['final_loss'])}, mean over the run {number(summary['best_loss'])}"
    return (
        f"loss       final {number(summary['final_loss'])} (mean of the last {min(window, steps)} steps "
        f"{number(summary['final_loss_mean'])}), best mean of {window} steps {number(summary['best_loss'])} "
        f"ending at step {summary['best_step']}"
    )


def _span_text(seconds: Any) -> str:
    value = finite(seconds)
    # A short run's whole seconds said "188 steps in 0s"; the viewer's clock keeps whole seconds (it ticks).
    return f"{value:.1f}s" if value is not None and 0 <= value < 10 else duration(seconds)


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _handled_text(steps: Any) -> str:
    return f"; {steps} more with a non-finite batch the model handled" if steps else ""


def as_text(summary: dict[str, Any]) -> str:
    share = summary["data_wait_share"]
    lines = [
        # Every string comes from a ledger, which may come from anywhere: shown literally.
        f"run        {safe(str(summary['name']))} ({safe(str(summary['run_id']))})",
        f"end        {safe(str(summary['end'] or 'no end record (the run was killed or is still going)'))}",
        f"steps      {summary['steps']} in {_span_text(summary['duration_s'])}, {_count(summary['evals'], 'eval')}",
        _loss_text(summary),
        f"data wait  {_share_text(share, summary['steps'])}",
        f"memory     peak allocated {size(summary['peak_mem_bytes'])}, peak RSS {size(summary['peak_rss_bytes'])}",
        f"nonfinite  {_count(summary['nonfinite_steps'], 'step')}{_handled_text(summary.get('handled_batch_steps'))}",
    ]
    for name, m in summary.get("eval_metrics", {}).items():
        best = "" if "best" not in m else f", best {number(m['best'])} at step {_step(m['best_step'])}"
        lines.append(f"eval       {safe(name, 30)}: last {number(m['last'])} at step {_step(m['last_step'])}{best}")
    if summary["alerts"]:
        lines.append("alerts")
        for rule, a in sorted(summary["alerts"].items(), key=lambda kv: kv[1]["first_step"] or 0):
            where = ""
            if a.get("ranks"):  # a multi-rank job (analysis/job.py): which rank saw it first, and which others
                first = a.get("first_rank", a["ranks"][0])
                others = [r for r in a["ranks"] if r != first]
                where = f" on rank {first}" + (f" (also ranks {', '.join(map(str, sorted(others)))})" if others else "")
            lines.append(
                f"  {safe(rule, 30):<16} {safe(a['severity'], 10):<8} x{a['count']}  first at step {a['first_step']}"
                + where
            )
    else:
        lines.append("alerts     none")
    if summary.get("rules"):
        lines.append(f"rules      {safe(summary['rules'], 300)}")  # what did not run: an alert it would have raised
    for resumed in summary.get("resumed", ()):
        where = f"resumed    at step {resumed['step']} from {safe(str(resumed['checkpoint']))}"
        if resumed["missing"] is None:
            lines.append(f"{where}; the steps before it are from {safe(str(resumed['ledger']))}")
        else:
            lines.append(f"{where}; the steps before it are not here ({safe(str(resumed['missing']))})")
    if summary["missing_records"]:
        lines.append(f"missing    {summary['missing_records']} records the disk could not take (see the gap records)")
    if summary["skipped_lines"]:
        lines.append(f"skipped    {summary['skipped_lines']} unreadable lines (a torn last line after a crash)")
    return "\n".join(lines)
