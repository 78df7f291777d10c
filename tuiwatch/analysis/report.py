"""``tuiwatch report``: a plain summary of a ledger, for logs and CI. Pure: no torch, no Textual."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from tuiwatch.analysis.format import duration, number, safe, size
from tuiwatch.ledger.chain import RunChain
from tuiwatch.ledger.fields import finite, integer, num
from tuiwatch.ledger.records import Record
from tuiwatch.rules import Diagnosis


def summarize(records: Iterable[Record], skipped: int = 0, chain: RunChain | None = None) -> dict[str, Any]:
    """The summary of a run; alerts are those in the ledger plus those the rules find on replay.

    Given the ``chain`` of a resumed run (``read_run``), ``records`` are its
    records, earlier parts included, and the summary says where it resumed.
    """
    records = list(records)
    recorded = {_alert_key(r) for r in records if r.get("kind") == "alert"}
    replayed = [a for a in Diagnosis().run(records) if _alert_key(a) not in recorded]
    summary = _summarize([*records, *replayed], skipped)
    summary["resumed"] = [] if chain is None else _resumes(chain)
    return summary


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


def _summarize(records: Iterable[Record], skipped: int) -> dict[str, Any]:
    run: Record = {}
    end: Record | None = None
    steps = 0
    first_t = last_t = None
    final_loss = best_loss = None
    best_step = None
    wait = compute = 0.0
    peak_mem = peak_rss = None
    alerts: dict[str, dict[str, Any]] = {}
    evals = 0
    nonfinite_steps = 0
    missing = 0  # records the file did not get (a full disk), from gap records
    for r in records:
        kind = r.get("kind")
        t = num(r.get("t"))
        if t is not None:
            first_t = t if first_t is None else first_t
            last_t = t
        if kind == "run":
            run = r
        elif kind == "step":
            steps += 1
            loss = num(r.get("loss"))
            if loss is not None:
                final_loss = loss
                if math.isfinite(loss) and (best_loss is None or loss < best_loss):
                    best_loss, best_step = loss, _alert_key(r)[1]
            step_wait, step_compute = finite(r.get("data_wait_s")), finite(r.get("compute_s"))
            if step_wait is not None and step_compute is not None:
                # Only steps where the wait was measured: a loop without batches()/fetching() has none.
                wait += step_wait
                compute += step_compute
            peak = num(r.get("mem_peak"))
            if peak is not None:
                peak_mem = max(peak_mem or 0, peak)
            flags = r.get("finite")
            if isinstance(flags, dict) and False in flags.values():
                nonfinite_steps += 1
        elif kind == "eval":
            evals += 1
        elif kind == "system":
            rss = num(r.get("rss"))
            if rss is not None:
                peak_rss = max(peak_rss or 0, rss)
        elif kind == "alert" and r.get("severity") != "info":
            rule = str(r.get("rule"))
            entry = alerts.setdefault(
                rule, {"count": 0, "first_step": _alert_key(r)[1], "severity": str(r.get("severity"))}
            )
            entry["count"] += 1
        elif kind == "gap":
            lost = integer(r.get("records"))
            missing += lost if lost is not None and lost > 0 else 0
        elif kind == "end":
            end = r
    total = wait + compute
    return {
        "name": run.get("name"),
        "run_id": run.get("run_id"),
        "steps": steps,
        "evals": evals,
        "duration_s": None if first_t is None or last_t is None else last_t - first_t,
        "final_loss": final_loss,
        "best_loss": best_loss,
        "best_step": best_step,
        "data_wait_share": wait / total if total > 0 else None,
        "peak_mem_bytes": peak_mem,
        "peak_rss_bytes": peak_rss,
        "nonfinite_steps": nonfinite_steps,
        "alerts": alerts,
        "end": None if end is None else end.get("reason"),
        "skipped_lines": skipped,
        "missing_records": missing,
    }


def _alert_key(r: Record) -> tuple[str, int | None]:
    return str(r.get("rule")), integer(r.get("step"))


def _share_text(share: float | None, steps: int) -> str:
    if share is not None:
        return f"{share:.1%} of step time"
    return "not measured (no watch.batches() or watch.fetching() in the loop)" if steps else "-"


def as_text(summary: dict[str, Any]) -> str:
    share = summary["data_wait_share"]
    best_step = summary["best_step"]
    lines = [
        # Every string comes from a ledger, which may come from anywhere: shown literally.
        f"run        {safe(str(summary['name']))} ({safe(str(summary['run_id']))})",
        f"end        {safe(str(summary['end'] or 'no end record (the run was killed or is still going)'))}",
        f"steps      {summary['steps']} in {duration(summary['duration_s'])}, {summary['evals']} evals",
        f"loss       final {number(summary['final_loss'])}, best {number(summary['best_loss'])}"
        f" at step {'-' if best_step is None else best_step}",
        f"data wait  {_share_text(share, summary['steps'])}",
        f"memory     peak allocated {size(summary['peak_mem_bytes'])}, peak RSS {size(summary['peak_rss_bytes'])}",
        f"nonfinite  {summary['nonfinite_steps']} steps",
    ]
    if summary["alerts"]:
        lines.append("alerts")
        for rule, a in sorted(summary["alerts"].items(), key=lambda kv: kv[1]["first_step"] or 0):
            lines.append(
                f"  {safe(rule, 30):<16} {safe(a['severity'], 10):<8} x{a['count']}  first at step {a['first_step']}"
            )
    else:
        lines.append("alerts     none")
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
