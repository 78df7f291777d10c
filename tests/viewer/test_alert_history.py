"""The alert pane as a history: levels, repeats as one row, a selection that scrolls, an alert opened whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuiwatch.viewer.panes.alerts import AlertsPane
from tuiwatch.viewer.screens.alert import AlertScreen, alert_text
from tuiwatch.viewer.sources import FileSource
from tuiwatch.viewer.state import Alert, RunState
from tuiwatch.viewer.views import AlertRow, alert_rows

from ..viewer_helpers import FIXED_NOW, RecordingApp, drawn, plain, until, write_ledger


def spike(step: int) -> Alert:
    return Alert("warning", step, "loss-spike", f"loss jumped at {step}")


def cleared(step: int) -> Alert:
    return Alert("info", step, "loss-spike", "loss-spike cleared")


HISTORY = (
    Alert("critical", 600, "nonfinite", "first at step 600"),
    Alert("critical", 590, "command", "checkpoint failed: disk full"),
    cleared(483),
    spike(480),
    cleared(423),
    spike(420),
    Alert("info", 400, "command", "checkpoint written"),
    cleared(303),
    spike(300),
)


def test_levels_show_criticals_then_warnings_then_all_and_repeats_of_a_rule_are_one_row():
    assert len(alert_rows(HISTORY, 3)) == len(HISTORY)  # the clears and commands keep the spikes apart
    assert alert_rows(HISTORY, 1) == (AlertRow(HISTORY[0]), AlertRow(HISTORY[1]))  # a failed command too
    rows = alert_rows(HISTORY, 2)
    assert [r.alert.rule for r in rows] == ["nonfinite", "command", "loss-spike"]
    assert rows[2] == AlertRow(spike(480), (480, 420, 300))
    assert rows[2].count == 3
    # Two commands in a row stay two rows: each is its own answer.
    commands = (Alert("info", 5, "command", "a"), Alert("info", 4, "command", "b"))
    assert len(alert_rows(commands, 3)) == 2


def test_an_alert_opened_whole_says_where_what_and_its_evidence():
    alert = Alert(
        "warning",
        50,
        "loss-spike",
        "loss 41 jumped",
        next_check="look at this batch",
        dump="runs/x/dumps/50-loss-spike",
        rank=1,
        evidence='{\n  "batch_ids": [3200, 3201]\n}',
    )
    text = alert_text(AlertRow(alert, (50, 20))).plain
    assert text.startswith("warning · loss-spike · step 50 · rank 1\n\nloss 41 jumped\n")
    assert "look at: look at this batch" in text
    assert "2 in a row of this rule, at steps 50, 20" in text
    assert "dump: runs/x/dumps/50-loss-spike" in text
    assert '"batch_ids": [3200, 3201]' in text


def history_ledger(tmp_path: Path) -> Path:
    records: list[dict[str, Any]] = [{"kind": "run", "t": 1.0, "name": "history", "run_id": "h", "host": "h"}]
    for step in range(300):
        records.append({"kind": "step", "t": 1.0 + step, "step": step, "loss": 1.0})
        if step % 10 == 5:
            evidence = {"batch_ids": [step * 64 + i for i in range(4)]}
            records.append(
                {
                    "kind": "alert",
                    "t": 1.0 + step,
                    "rule": "loss-spike",
                    "severity": "warning",
                    "step": step,
                    "message": f"loss jumped at {step}",
                    "evidence": evidence,
                }
            )
        if step % 10 == 8:
            records.append(
                {
                    "kind": "alert",
                    "t": 1.0 + step,
                    "rule": "loss-spike",
                    "severity": "info",
                    "step": step,
                    "message": "loss-spike cleared",
                    "evidence": {},
                }
            )
    return write_ledger(tmp_path / "ledger.jsonl", records)


async def test_the_pane_moves_through_its_history_filters_it_and_opens_an_alert(tmp_path: Path):
    app = RecordingApp(FileSource(history_ledger(tmp_path)), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.loading is None and app.state.step == 299)
        pane = app.query_one(AlertsPane)
        pane.focus()
        await drawn(pilot)
        assert plain(pane).splitlines()[0] == "info    298 loss-spike: cleared"
        await pilot.press(*["down"] * 22)  # the first selects the newest; then row 21 of 60: the spike at 195
        await drawn(pilot)
        lines = plain(pane).splitlines()
        assert lines[0].startswith("↑ ")
        assert any(line == "warn    195 loss-spike: loss jumped at 195" for line in lines)
        await pilot.press("enter")
        assert isinstance(app.screen, AlertScreen)
        assert app.screen.row.alert.step == 195
        assert app.cursor == 195  # every chart read at the alert's step
        assert '"batch_ids": [\n    12480,' in app.screen.row.alert.evidence
        await pilot.press("escape", "plus", "plus")  # zoomed on steps 111-185: the next alert is elsewhere
        assert app.zoom is not None
        assert not app.zoom[0] <= 5 <= app.zoom[1]
        pane.focus()
        await pilot.press(*["down"] * 38, "enter", "escape")  # the spike at step 5
        assert app.cursor == 5
        assert app.zoom[0] <= 5 <= app.zoom[1]  # the zoom moved to show it, as wide as it was
        await pilot.press("0")
        await pilot.press("2")  # warnings and up: the clears hidden, thirty spikes in a row are one row
        await drawn(pilot)
        lines = plain(pane).splitlines()
        assert lines[0] == "warnings and up (30 hidden: 3 shows all)"
        assert lines[1] == "warn    295 loss-spike: ×30, steps 5-295: loss jumped at 295"
        await pilot.press("1")
        await drawn(pilot)
        assert plain(pane) == "no critical alerts (60 others: 3 shows all)"
        await pilot.press("3")
        await drawn(pilot)
        assert plain(pane).splitlines()[0] == "info    298 loss-spike: cleared"


def test_an_alert_of_an_unknown_severity_is_shown_with_everything():
    odd = Alert("bogus", 3, "x", "from another tool")
    assert alert_rows((odd,), 3) == (AlertRow(odd),)
    assert alert_rows((odd,), 2) == ()


def test_an_alert_whose_evidence_holds_an_integer_past_64_bits_is_kept_with_it_as_digits():
    # Found by the fuzz test: the evidence's JSON for the alert screen raised on such a number (orjson stops at 64).
    state = RunState()
    state.apply({"kind": "alert", "rule": "x", "severity": "warning", "step": 1, "evidence": {"n": -(2**63) - 1}})
    (alert,) = state.alerts
    assert alert.evidence == '{\n  "n": "-9223372036854775809"\n}'
