"""Zoom and pan on the step axis (+ - ← → 0, the mouse wheel): every chart shows the same steps."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Group
from rich.text import Text
from textual import events

from tuiwatch.viewer.panes.memory import MemoryPane
from tuiwatch.viewer.panes.metrics import MetricsPane
from tuiwatch.viewer.panes.timing import TimingPane
from tuiwatch.viewer.panes.training import TrainingPane
from tuiwatch.viewer.render.chart import LABEL_WIDTH
from tuiwatch.viewer.sources import FileSource
from tuiwatch.viewer.state import RunState
from tuiwatch.viewer.views import MIN_ZOOM_STEPS, cursor_moved, zoom_span

from ..viewer_helpers import FIXED_NOW, RecordingApp, drawn, plain, shown, until, write_ledger

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"


def test_zooming_halves_or_doubles_about_the_middle_and_stays_within_the_run():
    extent = (0, 1000)
    assert zoom_span(extent, extent, 0.5) == (250, 750)
    assert zoom_span(extent, (250, 750), 1.0, 0.25) == (375, 875)
    assert zoom_span(extent, (375, 875), 1.0, 0.5) == (500, 1000)  # at the end: it stops there
    assert zoom_span(extent, (0, 500), 1.0, -0.25) == (0, 500)
    assert zoom_span(extent, (250, 750), 2.0) is None  # the whole run again: follow it
    narrow = zoom_span(extent, (500, 510), 0.5)
    assert narrow is not None
    assert narrow[1] - narrow[0] == MIN_ZOOM_STEPS - 1


async def test_plus_zooms_every_chart_in_arrows_pan_and_zero_follows_the_run_again():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"))
        await pilot.press("plus")
        await drawn(pilot)
        assert app.zoom == (37, 111)  # steps 0-149: the middle half
        training = app.query_one(TrainingPane)
        lines = plain(training).splitlines()
        assert "steps 37-111" in lines[0]
        axis = next(line for line in lines if line.strip().startswith("37"))
        assert axis.split()[0] == "37"
        assert axis.split()[-1] == "111"
        timing = app.query_one(TimingPane).view
        assert timing is not None
        assert timing.chart.span == (37, 111)
        await pilot.press("right")
        await drawn(pilot)
        assert app.zoom is not None
        assert app.zoom[1] - app.zoom[0] == 74
        assert app.zoom[0] > 37
        await pilot.press("m")
        await drawn(pilot)
        metrics = app.query_one(MetricsPane).view
        assert metrics is not None
        assert {c.chart.span for c in metrics.cells} == {app.zoom}
        await pilot.press("m", "0")
        await drawn(pilot)
        assert app.zoom is None
        assert "all steps" in plain(training).splitlines()[0]
        await pilot.press("minus")  # already the whole run
        assert app.zoom is None


async def test_the_mouse_wheel_over_a_chart_zooms_in_and_out():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"))
        training = app.query_one(TrainingPane)
        # The terminal's wheel events, as the driver posts them to the widget under the mouse.
        training.post_message(events.MouseScrollUp(training, 10, 5, 0, -1, 0, False, False, False))
        await until(pilot, lambda: app.zoom == (37, 111), what="the wheel to zoom in")
        training.post_message(events.MouseScrollDown(training, 10, 5, 0, 1, 0, False, False, False))
        await until(pilot, lambda: app.zoom is None, what="the wheel to zoom out")


async def test_the_cursor_reads_every_chart_at_one_step_and_is_drawn_there():
    records = [json.loads(line) for line in (LEDGERS / "healthy.jsonl").read_text().splitlines()]
    loss = {r["step"]: r["loss"] for r in records if r["kind"] == "step"}
    evals = {r["step"]: r["val_loss"] for r in records if r["kind"] == "eval"}
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"))
        await pilot.press("full_stop")
        await drawn(pilot)
        assert app.cursor == 74  # the middle of steps 0-149
        training = app.query_one(TrainingPane)
        view = training.view
        assert view is not None
        assert (view.at_step, view.train_value) == (74, loss[74])
        assert view.eval_value == evals[max(s for s in evals if s <= 74)]
        rendered = training.render()
        assert isinstance(rendered, Group)
        rows = [r for r in rendered.renderables if isinstance(r, Text)]
        assert rows[0].plain.startswith("@ step 74  loss ")
        # The loss chart's rows: the cursor's column in reverse video, the same column in each.
        marked = {
            span.start
            for row in rows[1:6]
            for span in row.spans
            if span.style == "reverse" and span.end - span.start == 1
        }
        assert len(marked) == 1
        await pilot.press("right")
        await drawn(pilot)
        assert app.cursor == 76  # to the record a column on: a sixtieth of 149 steps, 2
        await pilot.press("m")
        await drawn(pilot)
        metrics = app.query_one(MetricsPane).view
        assert metrics is not None
        values = {c.name: c.value for c in metrics.cells}
        assert values["loss"] == loss[76]
        assert values["eval val_loss"] == evals[max(s for s in evals if s <= 76)]
        await pilot.press("m", "full_stop")
        assert app.cursor is None


async def test_an_lr_that_never_changes_is_one_line_and_gives_its_rows_to_the_loss():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)  # lr 0.1 throughout
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"))
        await drawn(pilot)
        lines = plain(app.query_one(TrainingPane)).splitlines()
        at = lines.index("lr (log) 0.1 constant")
        assert lines[at + 1].startswith("grad norm pre-clip (log)")
        assert at > 20  # the loss chart has the rows (of 32)


async def test_a_click_on_a_chart_puts_the_cursor_at_the_step_under_it():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"))
        await drawn(pilot)
        training = app.query_one(TrainingPane)
        # The pane's content starts after its border and padding (2 cells); its charts' dots after their labels.
        cells = training.content_region.width - LABEL_WIDTH
        await pilot.click(TrainingPane, offset=(2 + LABEL_WIDTH + cells - 1, 5))  # the last column: the last step
        await until(pilot, lambda: app.cursor == 149, what="the cursor at the last step")
        await pilot.click(TrainingPane, offset=(2 + LABEL_WIDTH, 5))  # the first column: its two dots' second
        await until(pilot, lambda: app.cursor is not None and app.cursor <= 2, what="the cursor at the start")
        await pilot.press("m")
        await drawn(pilot)
        await pilot.click(MetricsPane, offset=(2 + LABEL_WIDTH, 4))
        await until(pilot, lambda: app.cursor is not None and app.cursor <= 5, what="the cursor from the grid")


async def test_a_click_on_a_constant_s_line_in_the_grid_moves_no_cursor():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(200, 60)) as pilot:
        await until(pilot, shown(app, "finished"))
        await pilot.press("m")
        await drawn(pilot)
        pane = app.query_one(MetricsPane)
        lines = plain(pane).splitlines()
        at = lines.index(next(line for line in lines if line.startswith("lr 0.1 constant")))
        assert at == 1 + 2 * 7  # the pane's line, two rows of charts, then the constant
        await pilot.click(MetricsPane, offset=(2 + LABEL_WIDTH + 5, 1 + at))  # 1: the border above the content
        await pilot.pause()
        assert app.cursor is None
        await pilot.click(MetricsPane, offset=(2 + LABEL_WIDTH + 5, 1 + at - 2))  # a chart's dots above it
        await until(pilot, lambda: app.cursor is not None, what="the cursor from a chart")


def test_the_cursor_steps_from_record_to_record_at_least_a_column_at_a_time():
    state = RunState()
    state.apply({"kind": "run", "t": 1.0, "name": "sparse"})
    for step in range(0, 1001, 50):  # a loss logged every 50 steps
        state.apply({"kind": "step", "t": 1.0 + step, "step": step, "loss": 1.0 / (1 + step)})
    shown = (0, 1000)  # a column is 16 steps: three presses would stay on one record
    assert cursor_moved(state, 500, shown, forward=True) == 550
    assert cursor_moved(state, 520, shown, forward=True) == 550  # between records: the next one
    assert cursor_moved(state, 550, shown, forward=False) == 500
    assert cursor_moved(state, 520, shown, forward=False) == 450  # 520 reads 500's record: the one before it
    assert cursor_moved(state, 1000, shown, forward=True) == 1000  # the last record: it stays
    assert cursor_moved(state, 0, shown, forward=False) == 0
    dense = RunState()
    for step in range(10_000):
        dense.apply({"kind": "step", "step": step, "loss": 1.0})
    assert cursor_moved(dense, 9500, (0, 9999), forward=True) == 9666  # a column's steps, not one record
    assert cursor_moved(dense, 9500, (0, 9999), forward=False) == 9334
    # Older than the last 1,000 points a series keeps buckets (16 steps here): the cursor goes to a bucket's last.
    assert cursor_moved(dense, 5000, (0, 9999), forward=True) == 5151


async def test_the_timing_and_memory_numbers_are_the_cursor_s_step(tmp_path: Path):
    records = []
    for line in (LEDGERS / "gpu.jsonl").read_text().splitlines():
        records.append(json.loads(line))
        if records[-1]["kind"] == "step" and records[-1]["step"] in (40, 100):  # NVML read after these steps
            util = {40: 50, 100: 70}[records[-1]["step"]]
            gpu = {"index": 0, "device": "cuda:0", "util": util, "mem_used": util * 2**30, "temp": 60, "power": 300}
            records.append({"kind": "system", "t": records[-1]["t"], "rss": util * 2**20, "gpus": [gpu]})
    steps = {r["step"]: r for r in records if r["kind"] == "step"}
    app = RecordingApp(FileSource(write_ledger(tmp_path / "ledger.jsonl", records)), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"))
        await pilot.press("full_stop")
        await drawn(pilot)
        timing, memory = app.query_one(TimingPane).view, app.query_one(MemoryPane).view
        assert timing is not None
        assert memory is not None
        at = steps[74]
        assert (timing.at_step, timing.data_wait_s, timing.compute_s) == (74, at["data_wait_s"], at["compute_s"])
        assert timing.examples_per_s == at["examples_per_s"]
        assert plain(app.query_one(TimingPane)).startswith("@ 74 wait ")
        assert memory.at_step == 74
        assert memory.device is not None
        assert (memory.device.allocated, memory.device.reserved, memory.device.peak) == (
            at["mem_allocated"],
            None,
            None,
        )
        # The GPU and the RSS as the system record after step 40 read them; what is kept of the last step only
        # (temperature, power, CPU) is not shown at the cursor.
        shown_gpu = memory.gpus[0]
        assert (shown_gpu.util_percent, shown_gpu.mem_used, memory.rss) == (50, 50 * 2**30, 50 * 2**20)
        assert (shown_gpu.temp_c, shown_gpu.power_w, memory.cpu_percent) == (None, None, None)
        assert plain(app.query_one(MemoryPane)).splitlines()[0] == "@ step 74"
        await pilot.press("full_stop")
        await drawn(pilot)
        timing, memory = app.query_one(TimingPane).view, app.query_one(MemoryPane).view
        assert timing is not None
        assert memory is not None
        assert (timing.at_step, timing.compute_s) == (None, steps[149]["compute_s"])
        assert (memory.at_step, memory.gpus[0].util_percent, memory.gpus[0].temp_c) == (None, 70, 60)
