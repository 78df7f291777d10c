"""``tuiwatch report`` of a multi-rank job: the run as its lowest rank saw it, then each rank, then the rules
that need every rank's records (``straggler``). Pure: no torch, no Textual; streamed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuiwatch.analysis.format import safe
from tuiwatch.analysis.report import as_text, summarize
from tuiwatch.ledger.chain import read_run
from tuiwatch.ledger.fields import finite, integer
from tuiwatch.ledger.ranks import merge_ranks
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.records import Record
from tuiwatch.rules import REGISTRY, Diagnosis

# Rules that see one rank's records are run per rank, in its process; these need all ranks' at once.
CROSS_RANK_RULES = ("straggler",)
PHASE_FIELDS = ("data_wait_s", "forward_s", "backward_s", "optimizer_s", "compute_s")
MAX_ALERTS = 10_000


class _Rank:
    def __init__(self, rank: int, ledger: Path):
        self.rank, self.ledger = rank, ledger
        self.steps = 0
        self.last_step: int | None = None
        self.end: str | None = None
        self.host: str | None = None
        self.sums = dict.fromkeys(PHASE_FIELDS, 0.0)
        self.counts = dict.fromkeys(PHASE_FIELDS, 0)

    def add(self, r: Record) -> None:
        kind = r.get("kind")
        if kind == "step":
            self.steps += 1
            self.last_step = integer(r.get("step"))
            for field in PHASE_FIELDS:
                value = finite(r.get(field))
                if value is not None:
                    self.sums[field] += value
                    self.counts[field] += 1
        elif kind == "run":
            self.host = str(r.get("host"))
        elif kind == "end":
            self.end = str(r.get("reason"))

    def result(self) -> dict[str, Any]:
        means = {f: self.sums[f] / self.counts[f] if self.counts[f] else None for f in PHASE_FIELDS}
        return {
            "rank": self.rank,
            "host": self.host,
            "ledger": str(self.ledger),
            "steps": self.steps,
            "last_step": self.last_step,
            "end": self.end,
            "mean_s": means,
        }


def summarize_job(ledgers: Mapping[int, Path]) -> dict[str, Any]:
    """The report of a job whose ranks wrote ``ledgers`` (rank → ledger path, as ``rank_ledgers`` finds them)."""
    first = min(ledgers)
    chain = read_run(ledgers[first])
    summary = summarize(chain.iter_records(), chain=chain)
    for alert in summary["alerts"].values():
        alert["ranks"] = [first]
    ranks = {rank: _Rank(rank, path) for rank, path in ledgers.items()}
    diagnosis = Diagnosis({rule: ({} if rule in CROSS_RANK_RULES else False) for rule in REGISTRY})
    found: list[Record] = []
    for r in merge_ranks({rank: read_ledger(path) for rank, path in ledgers.items()}):
        rank = r["rank"]
        ranks[rank].add(r)
        if r.get("kind") == "alert":
            if rank != first and r.get("severity") != "info":
                _fold_alert(summary["alerts"], r, rank)
        elif len(found) < MAX_ALERTS:
            found += diagnosis.feed(r)
    for alert in found:
        if alert.get("severity") != "info":
            _fold_alert(summary["alerts"], alert, integer(alert["evidence"].get("rank")))
    summary["world_size"] = len(ledgers)
    summary["ranks"] = [ranks[rank].result() for rank in sorted(ranks)]
    summary["cross_rank"] = [a for a in found if a.get("severity") != "info"][:100]
    return summary


def _fold_alert(alerts: dict[str, dict[str, Any]], r: Record, rank: int | None) -> None:
    rule, step = str(r.get("rule")), integer(r.get("step"))
    entry = alerts.setdefault(rule, {"count": 0, "first_step": step, "severity": str(r.get("severity")), "ranks": []})
    entry["count"] += 1
    if step is not None and (entry["first_step"] is None or step < entry["first_step"]):
        entry["first_step"] = step
        entry["first_rank"] = rank
    if rank is not None and rank not in entry["ranks"]:
        entry["ranks"].append(rank)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def job_text(summary: dict[str, Any]) -> str:
    lines = [
        as_text(summary),
        f"ranks      {summary['world_size']} (the run above is rank {summary['ranks'][0]['rank']})",
    ]
    lines.append("  phases in ms a step, the mean over each rank's steps")
    lines.append("  rank  host              steps  last      wait  forward  backward   optim  end")
    for r in summary["ranks"]:
        m = r["mean_s"]
        lines.append(
            f"  {r['rank']:<5} {safe(str(r['host']), 16):<17} {r['steps']:<6} {r['last_step']!s:<6} "
            f"{_ms(m['data_wait_s']):>7} {_ms(m['forward_s']):>8} {_ms(m['backward_s']):>9} "
            f"{_ms(m['optimizer_s']):>7}  {safe(str(r['end'] or 'no end record'), 30)}"
        )
    for alert in summary["cross_rank"][:5]:
        lines.append(
            f"  {safe(str(alert.get('rule')), 16)} at step {alert.get('step')}: {safe(str(alert.get('message')))}"
        )
    return "\n".join(lines)
