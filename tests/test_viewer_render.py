"""The viewer's pure parts: the fold, decimation, charts and text safety, as values and strings."""

from __future__ import annotations

import math
from pathlib import Path

from rich.style import Style

from tuiwatch.analysis.format import duration, number, safe, size
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.viewer.render.chart import chart
from tuiwatch.viewer.render.series import Series
from tuiwatch.viewer.state import RunState

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"


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
    assert state.eval_metric() == "val_loss"
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
    assert state.status == "finished"


def test_a_command_is_pending_until_its_action_arrives():
    state = RunState()
    state.command_sent(3, "checkpoint")
    assert state.pending == {3: "checkpoint"}
    assert state.alerts[0].message.startswith("checkpoint sent")
    state.apply({"kind": "action", "id": 3, "action": "checkpoint", "ok": True, "path": "runs/x/step-10.pt", "step": 9,
                 "bytes": 36012, "steps_done": 10})  # fmt: skip
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


def test_a_series_of_a_million_steps_stays_bounded_and_keeps_the_last_points_exact():
    series = Series(buckets=1024, recent=1000)
    for step in range(1_000_000):
        series.add(step, math.sin(step / 1000))
    assert len(series.buckets) <= 1024
    assert len(series.recent) == 1000
    assert [c.step for c in series.window(100, 200)] == list(range(999_900, 1_000_000))
    whole = series.window(None, 160)
    assert len(whole) <= 160
    assert whole[0].step < 10_000
    assert whole[-1].step == 999_999
    assert min(c.lo for c in whole) < -0.99
    assert max(c.hi for c in whole) > 0.99


def test_a_replayed_or_non_finite_point_is_not_drawn():
    series = Series()
    series.add(5, 1.0)
    series.add(5, 2.0)
    series.add(4, 3.0)
    series.add(6, math.nan)
    assert series.count == 1
    assert series.current == 1.0
    assert series.last_step == 6


def drawn(series: Series, width: int, height: int, log: bool = False) -> list[str]:
    """The chart as a pane draws it, as plain text."""
    return [row.plain for row in chart([(series, Style())], width, height, None, log)]


def test_a_rising_line_is_drawn_bottom_left_to_top_right():
    series = Series()
    for step in range(8):
        series.add(step, float(step))
    assert drawn(series, 12, 2) == [
        "      7┤⠀⠀⣠⠞",
        "      0┤⣠⠞⠁⠀",
    ]


def test_log_scale_labels_are_powers_and_empty_charts_say_so():
    series = Series()
    for step, value in enumerate([1.0, 10.0, 100.0, 1000.0]):
        series.add(step, value)
    lines = drawn(series, 12, 3, log=True)
    assert lines[0].startswith("  1e+03┤")
    assert lines[-1].startswith("      1┤")
    assert drawn(Series(), 12, 3) == ["        (no data yet)", "", ""]


def test_text_from_a_run_is_made_literal():
    hostile = "loss\x1b]52;c;aGVsbG8=\x07[bold red]x[/]\x9b2J\u202e"
    shown = safe(hostile)
    assert "\x1b" not in shown
    assert "\x07" not in shown
    assert "\x9b" not in shown
    assert "\u202e" not in shown
    assert "[bold red]x[/]" in shown  # markup characters stay characters
    assert safe("x" * 500, limit=10) == "x" * 9 + "…"


def test_numbers_sizes_and_durations_are_short():
    assert [number(v) for v in (0.012345, 1.5e-6, 123456.0, math.nan, math.inf, None, 42)] == [
        "0.01235", "1.50e-06", "123k", "nan", "inf", "-", "42",
    ]  # fmt: skip
    assert [size(v) for v in (512, 2048, 3 * 1024**3)] == ["512 B", "2.0 KiB", "3.0 GiB"]
    assert [duration(v) for v in (5, 125, 7500, 200000)] == ["5s", "2m05s", "2h05m", "2d07h"]


def test_a_nearly_flat_series_gets_axis_labels_that_differ():
    series = Series()
    for step in range(50):
        series.add(step, 324_000_000 + step * 1000)
    lines = drawn(series, 30, 3)
    labels = [line.split("┤")[0].strip() for line in lines]
    assert labels == ["324.05M", "324.02M", "324M"]
