"""Non-finite numbers, wherever in the chain data → model → loss → gradients → parameters they first appear."""

from __future__ import annotations

from tuiwatch.ledger.records import FINITE_BOUNDARIES, AlertRecord, Record, alert_record
from tuiwatch.rules.base import Rule


class NonFinite(Rule):
    """The first NaN or inf, named by the first boundary of data → model → loss → gradients → parameters."""

    id = "nonfinite"

    def check(self, record: Record) -> AlertRecord | None:
        finite = record.get("finite")
        if not isinstance(finite, dict):
            return None
        failed = [b for b in FINITE_BOUNDARIES if finite.get(b) is False]
        if not failed:
            return None
        boundary = failed[0]
        loss, norm = record.get("loss"), record.get("grad_norm")
        ids = record.get("batch_ids")
        evidence = {
            "boundary": boundary,
            "failed": failed,
            "loss": loss,
            "grad_norm": norm,
            "batch_ids": ids[:64] if isinstance(ids, list) else None,
        }
        return alert_record(
            self.id,
            "critical",
            record.get("step"),
            f"first at step {record.get('step')}, boundary={boundary} (loss {loss}, grad norm {norm})",
            evidence,
            f"fix the {boundary} boundary: look at that batch's ids and what produces it",
        )

    def clears(self, record: Record) -> bool:
        finite = record.get("finite")
        return isinstance(finite, dict) and False not in finite.values()
