"""The viewer's fold: a ledger in, the run as the panes need it out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuiwatch.ledger.reader import read_ledger
from tuiwatch.viewer.state import RunState
from tuiwatch.viewer.views import eval_metric, header_view

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"


def fold(name: str) -> RunState:
    state = RunState()
    state.apply_all(read_ledger(LEDGERS / name))
    return state


def test_folding_a_finished_ledger_gives_its_last_values():
    records = list(read_ledger(LEDGERS / "healthy.jsonl"))
    steps = [r for r in records if r["kind"] == "step"]
    state = fold("healthy.jsonl")
    assert state.status == "finished"
    assert state.end_reason == "finished"
    assert state.step == steps[-1]["step"] == 149
    assert state.metrics["loss"].current == steps[-1]["loss"]
    assert state.grad_norm.current == steps[-1]["grad_norm"]
    assert eval_metric(state) == "val_loss"
    assert state.eval_metrics["val_loss"].count == 3
    assert state.name == "demo-mlp"
    assert state.run["host"] == "gpu-box"


def test_status_goes_live_then_disconnected_when_the_ledger_has_no_end():
    state = fold("killed.jsonl")
    assert state.status == "live"
    state.disconnected()
    assert state.status == "disconnected"


def test_alerts_are_newest_first_and_the_end_reason_is_kept():
    state = fold("alerts.jsonl")
    assert [(a.rule, a.step, a.severity) for a in state.alerts] == [
        ("nonfinite", 120, "critical"),
        ("loss-spike", 60, "warning"),
    ]
    assert state.end_reason == "nonfinite"
    assert state.status == "failed"  # not "finished": the run stopped on a NaN


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        ("finished", "finished"),
        ("stopped", "stopped"),
        ("nonfinite", "failed"),
        ("exception", "failed"),
        ("killed", "failed"),
    ],
)
def test_the_end_reason_decides_the_status(reason: str, status: str):
    state = RunState()
    state.apply_all([{"kind": "run", "t": 1.0, "name": "r"}, {"kind": "step", "t": 2.0, "step": 41}])
    state.apply({"kind": "end", "t": 3.0, "reason": reason})
    assert (state.status, state.end_reason) == (status, reason)
    state.disconnected()  # the socket closing after the end record changes nothing
    assert state.status == status


def test_a_command_is_pending_until_its_action_arrives():
    state = RunState()
    state.command_sent(3, "checkpoint")
    assert state.pending == {3: "checkpoint"}
    assert state.alerts[0].message.startswith("checkpoint sent")
    state.apply(
        {
            "kind": "action",
            "id": 3,
            "action": "checkpoint",
            "ok": True,
            "path": "runs/x/step-10.pt",
            "step": 9,
            "bytes": 36012,
            "steps_done": 10,
        }
    )
    assert state.pending == {}
    assert [r["id"] for r in state.take_answered()] == [3]  # the reply to this viewer's command, once
    assert state.take_answered() == []
    assert state.alerts[0].message == "checkpoint written: runs/x/step-10.pt (35.2 KiB, step 10)"
    state.apply({"kind": "action", "id": 5, "action": "checkpoint", "ok": True, "path": "x.pt", "bytes": "huge"})
    assert state.alerts[0].message == "checkpoint written: x.pt"  # a field of the wrong type is left out
    state.apply({"kind": "action", "id": 6, "action": "pause", "ok": True, "step": 9})
    assert state.alerts[0].message == "paused after step 9"
    assert state.status == "paused"
    state.apply({"kind": "action", "id": 4, "action": "pause", "ok": False, "error": "disk full", "step": 9})
    assert state.alerts[0].message == "pause failed: disk full"
    assert state.alerts[0].severity == "warning"


def test_the_alert_pane_is_ordered_by_step_then_by_the_chain():
    state = RunState()
    alert = {"kind": "alert", "t": 1.0, "severity": "warning", "message": "m", "next_check": ""}
    for rule, step in [("grad-explosion", 466), ("loss-chance", 466), ("loss-spike", 466), ("overfit", 500)]:
        state.apply({**alert, "rule": rule, "step": step})
    state.apply({**alert, "rule": "loss-spike", "step": 480})  # judged late: it goes where its step is
    assert [(a.rule, a.step) for a in state.alerts] == [
        ("overfit", 500),
        ("loss-spike", 480),
        ("loss-chance", 466),  # at one step, the cause above its symptoms, in the chain's order
        ("loss-spike", 466),
        ("grad-explosion", 466),
    ]


def test_the_header_names_an_active_critical_alert_over_a_newer_warning_and_a_cleared_one_last():
    # pytorch/examples' DDP tutorial: grad-zero (critical) at step 4, then loss-frozen (a warning) at step 49. The
    # header named the newest, the warning; the run had been broken since step 4.
    def alert(rule: str, severity: str, step: int, rank: int | None = None) -> dict[str, object]:
        return {
            "kind": "alert",
            "t": 1.0,
            "rule": rule,
            "severity": severity,
            "step": step,
            "message": "",
            "rank": rank,
        }

    def named(*records: dict[str, object]) -> tuple[str, int | None] | None:
        state = RunState()
        state.apply_all([{"kind": "run", "t": 0.0, "name": "r"}, *records])
        view = header_view(state, None, "replay")
        return None if view.alert is None else (view.alert.rule, view.alert.step)

    assert named(alert("grad-zero", "critical", 4), alert("loss-frozen", "warning", 49)) == ("grad-zero", 4)
    # Cleared, it gives way to the active warning; with nothing active, the newest serious alert is named.
    cleared = alert("grad-zero", "info", 7)
    assert named(alert("grad-zero", "critical", 4), cleared, alert("loss-spike", "warning", 49)) == ("loss-spike", 49)
    spike, spike_cleared = alert("loss-spike", "warning", 3), alert("loss-spike", "info", 5)
    assert named(spike, alert("grad-zero", "critical", 4), cleared) == ("loss-spike", 3)  # still active
    assert named(spike, alert("grad-zero", "critical", 4), spike_cleared, cleared) == ("grad-zero", 4)
    # Per rank: rank 1's episode is active though rank 0's cleared.
    assert named(
        alert("grad-zero", "critical", 4, rank=0),
        alert("grad-zero", "critical", 4, rank=1),
        alert("grad-zero", "info", 7, rank=0),
        alert("loss-spike", "warning", 49, rank=0),
    ) == ("grad-zero", 4)
    assert named() is None
