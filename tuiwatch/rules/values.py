"""Non-finite numbers, wherever in the chain data → model → loss → gradients → parameters they first appear."""

from __future__ import annotations

from typing import Any

from tuiwatch.ledger.fields import num
from tuiwatch.ledger.numbers import number
from tuiwatch.ledger.records import FINITE_BOUNDARIES, AlertRecord, Record, alert_record
from tuiwatch.rules.base import Rule

# What to look at, by the first boundary that failed: the link of the chain that broke.
ADVICE = {
    "batch": "the data: this batch holds NaN/inf before the model ran; its samples' ids are in the evidence "
    "(and the dump); check the dataset and transforms for them",
    "forward": "the model: a finite batch gave a non-finite output; tuiwatch.first_nonfinite_module(model, batch) "
    "on the dump names the layer (log/sqrt/division, fp16 overflow)",
    "loss": "the loss: finite outputs gave a non-finite loss (log of 0, a division by 0, labels out of range, "
    "an empty mask)",
    "grad": "the gradients: a finite loss gave non-finite gradients; lower the lr, clip, use a GradScaler for fp16, "
    "check custom backward functions",
    "param": "the update: finite gradients made the weights non-finite; the lr, the optimizer's state "
    "(Adam's eps, a stale momentum), weight decay",
}

# ... when the boundary before it was not checked: the advice above claims what was not seen.
ADVICE_UNCHECKED = {
    "forward": "the model, or the data: the output is non-finite and its batch was not seen (watch.batches() or "
    "watch.step(batch) gives it); tuiwatch.first_nonfinite_module(model, batch) on a batch of the step names the layer",
    "loss": "the loss, or the model: the loss is non-finite and the model's output was not checked (the model "
    "returned its loss alone, as MMEngine's and detection models do, or its forward ran without the Watch's hook: "
    "model.forward(x) in place of model(x), or its parts called one by one); "
    "tuiwatch.first_nonfinite_module(model, batch) on the dump names the layer that made the first NaN/inf",
    "grad": "the gradients, or the loss: the gradients are non-finite and the loss was not checked "
    "(watch.log(loss=loss) checks it); the lr, clipping, a GradScaler for fp16, custom backward functions",
    "param": "the update, or the gradients: the weights became non-finite and the gradients were not checked; "
    "the lr, the optimizer's state, weight decay",
}


class NonFinite(Rule):
    """The first NaN or inf, named by the first boundary of data → model → loss → gradients → parameters.

    Under a GradScaler (the step record has a ``scale``), gradients that
    overflow at the loss scale while the loss is finite are how the scaler
    works: it skips that optimizer step and lowers the scale. Each such skip
    is an ``info`` alert with the scale change, not an episode. It is
    critical when the scaler skipped ``max_skips`` steps in a row, when the
    scale has fallen below 1 (the gradients are not finite even unscaled),
    and whenever the batch, forward, loss or parameters fail.

    A batch that holds NaN/inf while the model's output (or the loss) stays
    finite is one the model handles: missing values encoded as NaN and
    imputed or masked inside the forward, NaN in padding it never reads.
    Nothing downstream broke, so that is one ``info`` alert for the run, not
    a critical episode, and such a step ends an episode as a finite one does.
    """

    id = "nonfinite"

    def __init__(self, max_skips: int = 10) -> None:
        super().__init__()
        self.max_skips = max_skips
        self.last_scale: float | None = None
        self.skips = 0  # steps the scaler skipped in a row
        self.handled_said = False  # the info on a non-finite batch the model handles: once a run
        self.handled_at: Any = None  # ... and its step

    def observe(self, record: Record) -> AlertRecord | None:
        scale = num(record.get("scale"))
        if scale is None and not self.active:  # no GradScaler (the usual): the finite flags alone
            if record.get("opt_step") is not None:
                self.skips = 0
            return self._begins(record)
        skipped = self._scaler_skip(record)
        if scale is not None:
            self.last_scale = scale
        if record.get("opt_step") is not None:
            self.skips = 0
        elif skipped is not None:
            self.skips += 1
        if skipped is not None and not self.active:
            if self.skips < self.max_skips:
                return skipped
            self.active, self.calm = True, 0
            return alert_record(
                self.id,
                "critical",
                record.get("step"),
                f"the GradScaler skipped {self.skips} steps in a row (scale now {scale:g}): "
                "the gradients are not finite at any scale it tried",
                {"boundary": "grad", "scaler_skips": self.skips, "scale": scale},
                "the loss or the model in fp16: a value past the fp16 range (bf16 or fp32 for that part), the lr",
            )
        return super().observe(record) if self.active else self._begins(record)

    def _begins(self, record: Record) -> AlertRecord | None:
        """The alert this record raises with no episode active; a critical one begins an episode (an info does
        not: a handled batch's note)."""
        found = self.check(record)
        self.active = found is not None and found["severity"] == "critical"
        return found

    def _scaler_skip(self, record: Record) -> AlertRecord | None:
        """The info alert for a step the GradScaler skipped as designed, or None."""
        finite = record.get("finite")
        scale = num(record.get("scale"))
        if scale is None or not isinstance(finite, dict) or record.get("opt_step") is not None:
            return None
        failed = [b for b in FINITE_BOUNDARIES if finite.get(b) is False]
        before = self.last_scale
        # Unmeasured gradients (no unscale_ + clip): the scale falling on a step without an update says it.
        fell = not failed and finite.get("grad") is None and before is not None and scale < before
        if not (failed == ["grad"] or fell) or scale < 1:
            return None
        change = f"scale {before:g} -> {scale:g}" if before is not None and before != scale else f"scale {scale:g}"
        return alert_record(
            self.id,
            "info",
            record.get("step"),
            f"GradScaler skipped step {record.get('step')}: gradients overflowed at the loss scale ({change})",
            {"boundary": "grad", "scaler_skip": True, "scale_before": before, "scale": scale},
            "nothing, if skips are rare; many in a row mean the gradients are not finite even unscaled",
        )

    def check(self, record: Record) -> AlertRecord | None:
        finite = record.get("finite")
        # A cheap exact pre-test: `in` matches by == (a 0 too), so when it finds nothing, no value is False.
        if not isinstance(finite, dict) or False not in finite.values():
            return None
        failed = [b for b in FINITE_BOUNDARIES if finite.get(b) is False]
        if not failed:
            return None
        if _handled_batch(failed, finite):
            return None if self.handled_said else self._handled(record)
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
        message = (
            f"first at step {record.get('step')}, boundary={boundary} (loss {number(loss)}, grad norm {number(norm)})"
        )
        before = FINITE_BOUNDARIES[: FINITE_BOUNDARIES.index(boundary)]
        unchecked = [b for b in before if finite.get(b) is None]
        if unchecked:
            evidence["unchecked"] = unchecked
            message += f"; not checked before it: {', '.join(unchecked)}"
        if boundary == "batch" and self.handled_said and len(failed) > 1:
            # Non-finite batches are this run's usual, so the batch is not the only suspect: say so, name no other.
            evidence["batch_handled_at"] = self.handled_at
            message += (
                f"; the model handled non-finite batches before (step {self.handled_at}): look at {failed[1]} too"
            )
        advice = ADVICE_UNCHECKED if before and before[-1] in unchecked else ADVICE
        return alert_record(
            self.id, "critical", record.get("step"), message, evidence, advice.get(boundary, f"the {boundary} boundary")
        )

    def _handled(self, record: Record) -> AlertRecord:
        self.handled_said, self.handled_at = True, record.get("step")
        ids = record.get("batch_ids")
        return alert_record(
            self.id,
            "info",
            record.get("step"),
            f"step {record.get('step')}'s batch holds NaN/inf and the model's output stays finite: the model handles "
            "them (missing values by design?); said once",
            {"boundary": "batch", "handled": True, "batch_ids": ids[:64] if isinstance(ids, list) else None},
            "nothing, if the data holds NaN on purpose (missing values the model imputes or masks); otherwise the "
            "dataset and transforms, for these samples",
        )

    def clears(self, record: Record) -> bool:
        finite = record.get("finite")
        if not isinstance(finite, dict):
            return False
        return False not in finite.values() or handled_batch(finite)


def _handled_batch(failed: list[str], finite: dict[str, object]) -> bool:
    """Only the batch is non-finite, and the model's output or the loss was measured finite: the model handles it."""
    return failed == ["batch"] and (finite.get("forward") is True or finite.get("loss") is True)


def handled_batch(finite: dict[str, object]) -> bool:
    """A step's ``finite`` flags say the model handled a non-finite batch (missing values it imputes): report's
    count of non-finite steps leaves such steps out, as the rule raises no episode for them."""
    return _handled_batch([b for b in FINITE_BOUNDARIES if finite.get(b) is False], finite)
