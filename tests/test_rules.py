"""Each rule, table-tested from small ledgers: when it fires, once per episode, and when it clears."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tuiwatch.ledger.reader import read_ledger
from tuiwatch.rules import REGISTRY, Diagnosis

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"
FINITE = {"batch": True, "forward": True, "loss": True, "grad": True, "param": True}


def step(i: int, **fields: Any) -> dict[str, Any]:
    record = {"kind": "step", "step": i, "loss": 1.0 / (i + 1), "lr": [0.1], "grad_norm": 1.0 + 0.01 * (i % 5),
              "opt_step": i + 1, "data_wait_s": 0.001, "compute_s": 0.01, "finite": dict(FINITE)}  # fmt: skip
    record.update(fields)
    return record


def fired(records: list[dict[str, Any]], rule: str | None = None) -> list[tuple[str, int, str]]:
    alerts = Diagnosis([rule] if rule else None).run(records)
    return [(a["rule"], a["step"], a["severity"]) for a in alerts]


def test_healthy_ledgers_raise_nothing():
    for name in ("healthy.jsonl", "killed.jsonl"):
        assert Diagnosis().run(read_ledger(LEDGERS / name)) == []
    assert fired([step(i) for i in range(500)]) == []


def test_nonfinite_names_the_first_failing_boundary_once_per_episode():
    records = [step(i) for i in range(10)]
    for i in (4, 5):
        records[i] = step(i, loss=math.inf, grad_norm=math.nan,
                          finite={**FINITE, "loss": False, "grad": False, "param": False})  # fmt: skip
    alerts = Diagnosis(["nonfinite"]).run(records)
    assert [(a["step"], a["severity"]) for a in alerts] == [(4, "critical"), (6, "info")]
    assert alerts[0]["evidence"]["boundary"] == "loss"
    assert alerts[0]["message"].startswith("first at step 4, boundary=loss")


def test_grad_explosion_fires_when_norm_grows_100x():
    records = [step(i) for i in range(30)] + [step(30, grad_norm=4.0), step(31, grad_norm=800.0)]
    alerts = Diagnosis(["grad-explosion"]).run(records)
    assert [(a["step"], a["severity"]) for a in alerts] == [(31, "warning")]
    assert "last: 1.03 → 1.04 → 4 → 800" in alerts[0]["message"]
    assert alerts[0]["evidence"]["grad_norm"] == 800.0
    assert fired([*records, step(32), step(33)], "grad-explosion") == [
        ("grad-explosion", 31, "warning"), ("grad-explosion", 32, "info"),
    ]  # fmt: skip


def test_grad_explosion_needs_history_but_not_for_huge_norms():
    assert fired([step(0, grad_norm=1e3), step(1, grad_norm=1e5)], "grad-explosion") == []
    assert fired([step(0, grad_norm=2e6)], "grad-explosion") == [("grad-explosion", 0, "warning")]


@pytest.mark.parametrize("norm", [0.0, None])
def test_grad_zero_fires_after_five_optimizer_steps_without_gradient(norm: float | None):
    records = [step(i, grad_norm=norm) for i in range(8)]
    assert fired(records, "grad-zero") == [("grad-zero", 4, "critical")]


def test_steps_without_an_optimizer_step_are_not_zero_gradients():
    assert fired([step(i, grad_norm=None, opt_step=None) for i in range(20)], "grad-zero") == []


def test_loss_frozen_fires_after_fifty_identical_losses():
    records = [step(i, loss=0.6931471805599453) for i in range(60)]
    assert fired(records, "loss-frozen") == [("loss-frozen", 49, "warning")]


def test_lr_zero_ignores_a_warm_up_that_starts_at_zero():
    warmup = [step(i, lr=[0.0]) for i in range(3)] + [step(i, lr=[0.01 * i]) for i in range(3, 20)]
    assert fired(warmup, "lr-zero") == []
    assert fired([step(i, lr=[0.0, 0.0]) for i in range(12)], "lr-zero") == [("lr-zero", 9, "warning")]


def test_eval_mode_fires_on_eval_records_in_training_mode():
    records = [step(0), {"kind": "eval", "step": 0, "val_loss": 0.3, "training": True}]
    assert fired(records, "eval-mode") == [("eval-mode", 0, "warning")]
    assert fired([{"kind": "eval", "step": 0, "val_loss": 0.3, "training": False}], "eval-mode") == []


def test_data_bound_fires_when_waiting_dominates_and_clears_when_it_stops():
    slow = [step(i, data_wait_s=0.03, compute_s=0.01) for i in range(60)]
    fast = [step(i, data_wait_s=0.001, compute_s=0.01) for i in range(60, 120)]
    assert fired(slow + fast, "data-bound") == [("data-bound", 49, "warning"), ("data-bound", 85, "info")]


def test_unknown_rule_ids_are_refused():
    with pytest.raises(ValueError, match="unknown rule ids \\['grad-explode'\\]"):
        Diagnosis(["grad-explode"])
    assert set(REGISTRY) <= {"nonfinite", "grad-explosion", "grad-zero", "no-update", "loss-frozen", "loss-chance",
                             "lr-zero", "data-bound", "memory-growth", "oom", "overfit", "eval-mode", "loss-spike",
                             "straggler"}  # fmt: skip
