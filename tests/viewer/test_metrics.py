"""The metrics view (``m``): a chart for every numeric series, on one step axis, filtered by name, a page at a time."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tuiwatch.viewer.panes.metrics import MetricsPane, grid_shape, layout
from tuiwatch.viewer.panes.training import TrainingPane
from tuiwatch.viewer.sources import FileSource
from tuiwatch.viewer.state import RunState
from tuiwatch.viewer.views import Chart, MetricCell, matches, metrics_view
from tuiwatch.viewer.widgets import FilterInput

from ..viewer_helpers import FIXED_NOW, RecordingApp, drawn, plain, shown, until, write_ledger

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"
HEALTHY = [
    "loss",
    "eval val_loss",
    "eval val_acc",
    "lr",
    "grad_norm",
    "param_norm",
    "update_norm",
    "update/param",
    "examples_per_s",
    "data_wait_s",
    "compute_s",
]


def focus_of(app: RecordingApp) -> object:
    return app.focused  # read afresh each time (a type checker would keep the first narrowing)


def state_of(name: str) -> RunState:
    state = RunState()
    state.apply_all(json.loads(line) for line in (LEDGERS / name).read_text().splitlines())
    return state


def test_every_numeric_series_is_a_chart_on_the_run_s_one_step_axis():
    state = state_of("healthy.jsonl")
    view = metrics_view(state, None)
    assert [c.name for c in view.cells] == HEALTHY
    assert view.total == len(HEALTHY)
    assert {c.chart.span for c in view.cells} == {(0, 149)}  # evals start later: same axis all the same
    assert {c.chart.span for c in metrics_view(state, 100).cells} == {(50, 149)}
    values = {c.name: c.value for c in view.cells}
    assert values["loss"] == state.last_step["loss"]
    ledger = [json.loads(line) for line in (LEDGERS / "healthy.jsonl").read_text().splitlines()]
    both = [r for r in ledger if r.get("update_norm") is not None and r.get("param_norm")][-1]
    assert values["update/param"] == both["update_norm"] / both["param_norm"]  # one step's two norms


def test_a_metric_at_nan_shows_nan_not_its_last_finite_value():
    state = state_of("healthy.jsonl")
    state.apply({"kind": "step", "step": 150, "loss": math.nan, "grad_norm": 0.5})
    values = {c.name: c.value for c in metrics_view(state, None).cells}
    loss = values["loss"]
    assert loss is not None
    assert math.isnan(loss)
    assert values["grad_norm"] == 0.5


@pytest.mark.parametrize(
    ("pattern", "kept"),
    [
        ("", HEALTHY),
        ("loss", ["loss", "eval val_loss"]),  # a regular expression, searched for, any case
        ("^eval", ["eval val_loss", "eval val_acc"]),
        ("*_norm", ["grad_norm", "param_norm", "update_norm"]),  # a glob: the whole name
        ("NORM$", ["grad_norm", "param_norm", "update_norm"]),
        ("update/(", []),  # not a valid expression: looked for as written
        ("data|compute", ["data_wait_s", "compute_s"]),
    ],
)
def test_the_filter_is_a_glob_or_a_regular_expression(pattern: str, kept: list[str]):
    assert [c.name for c in metrics_view(state_of("healthy.jsonl"), None, pattern).cells] == kept
    assert matches("update/(x", "update/(")


def test_the_grid_fits_the_pane():
    assert grid_shape(76, 20) == (2, 2)
    assert grid_shape(196, 56) == (6, 7)
    assert grid_shape(20, 5) == (1, 1)  # never none


def test_constant_series_are_one_line_each_after_the_charts_and_pages_hold_what_fits():
    chart = Chart((), None)
    cells = [MetricCell(f"c{i}", 1.0, chart, constant=i % 3 == 0) for i in range(9)]  # c0 c3 c6 constant
    pages = layout(cells, 76, 16)  # 2 charts across; 15 rows under the status line: 2 rows of charts, then 1
    names = [[[c.name for c in band] for band in page] for page in pages]
    assert names == [[["c1", "c2"], ["c4", "c5"]], [["c7", "c8"], ["c0", "c3"], ["c6"]]]
    assert len(layout(cells[:1], 76, 3)) == 1  # a page always holds its first row, whatever the height


async def test_m_shows_every_metric_and_the_filter_and_pages_work():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, shown(app, "finished"))
        await pilot.press("m")
        await drawn(pilot)
        pane = app.query_one(MetricsPane)
        assert pane.display
        assert not app.query_one(TrainingPane).display
        lines = plain(pane).splitlines()
        assert lines[0].startswith("11 metrics  page 1/3")
        assert lines[1].split() == ["loss", "0.03734", "eval", "val_loss", "0.02241"]
        # Every chart's step axis is the run's: 0 to 149.
        axes = [line for line in lines if line.strip().startswith("0 ")]
        assert axes
        assert all(a.split() == ["0", "74", "149", "0", "74", "149"] for a in axes)
        await pilot.press("right_square_bracket", "right_square_bracket", "right_square_bracket")
        await drawn(pilot)
        assert plain(pane).splitlines()[0].startswith("11 metrics  page 3/3")  # no page past the last
        last_page = plain(pane).splitlines()
        assert last_page[1].split()[:2] == ["data_wait_s", "556µs"]  # the 9th chart of 10
        # The lr never changed: one line under the charts, not a chart of one value.
        assert last_page[-1].split() == ["lr", "0.1", "constant"]
        await pilot.press("slash", "c", "o", "m")  # typed into the filter: no c command goes to the run
        await drawn(pilot)
        assert isinstance(focus_of(app), FilterInput)
        assert plain(pane).splitlines()[0].startswith("1 of 11 metrics  filter com")
        await pilot.press("enter")
        assert focus_of(app) is pane
        assert app.metrics_pattern == "com"
        await pilot.press("slash", "x", "escape")  # escape gives the filter back as it was
        await drawn(pilot)
        assert app.metrics_pattern == "com"
        assert plain(pane).splitlines()[1].split()[:2] == ["compute_s", "3.3ms"]
        assert not [n for n in app.notes if "read-only" in n]
        await pilot.press("m")
        assert not pane.display
        assert app.query_one(TrainingPane).display
        assert app.focused is app.query_one(TrainingPane)


async def test_a_run_with_many_metrics_pages_them_and_the_window_key_applies(tmp_path: Path):
    records: list[dict[str, Any]] = [{"kind": "run", "t": 1.0, "name": "many"}]
    for step in range(300):
        records.append({"kind": "step", "t": 1.0 + step, "step": step, **{f"m{i:02d}": step * i for i in range(20)}})
    app = RecordingApp(FileSource(write_ledger(tmp_path / "ledger.jsonl", records)), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(200, 60)) as pilot:
        await until(pilot, lambda: app.loading is None and app.state.step == 299)
        await pilot.press("m", "w")
        await drawn(pilot)
        lines = plain(app.query_one(MetricsPane)).splitlines()
        assert lines[0].startswith("20 metrics")  # 6 x 7 charts fit 200x60: one page
        assert "last 1k" in lines[0]
        assert lines[1].split()[:4] == ["m01", "299", "m02", "598"]
        assert lines[-1].split() == ["m00", "0", "constant"]  # 0 all along: a line below the charts


async def test_e_cycles_the_moving_average_and_y_the_log_axis_of_the_loss_and_the_metrics():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"))
        training = app.query_one(TrainingPane)
        await pilot.press("e", "e")
        await drawn(pilot)
        assert training.view is not None
        assert training.view.loss.smooth == 0.9
        assert training.view.lr.smooth == 0.0  # lr and grad norm: each step's own value is the news
        assert plain(training).splitlines()[0].endswith("all steps  ema 0.9")
        await pilot.press("y")
        await drawn(pilot)
        assert training.view.loss.log
        assert plain(training).splitlines()[0].endswith("ema 0.9  log")
        await pilot.press("m")
        await drawn(pilot)
        metrics = app.query_one(MetricsPane).view
        assert metrics is not None
        assert all(c.chart.log for c in metrics.cells)
        assert {c.chart.smooth for c in metrics.cells} == {0.9}
        await pilot.press("e", "e", "y")  # 0.99, then off
        await drawn(pilot)
        metrics = app.query_one(MetricsPane).view
        assert metrics is not None
        assert {c.chart.smooth for c in metrics.cells} == {0.0}
        assert [c.name for c in metrics.cells if c.chart.log] == ["lr", "grad_norm", "update_norm", "update/param"]
        assert app.notes[:2] == ["smoothing: moving average, weight 0.6", "smoothing: moving average, weight 0.9"]


async def test_o_leaves_the_outliers_off_the_loss_and_metrics_ranges():
    app = RecordingApp(FileSource(LEDGERS / "alerts.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "failed"))
        training = app.query_one(TrainingPane)
        await pilot.press("o")
        await drawn(pilot)
        assert training.view is not None
        assert training.view.loss.clip == 0.01
        assert training.view.lr.clip == 0.0
        assert plain(training).splitlines()[0].endswith("all steps  clip")
        await pilot.press("m")
        await drawn(pilot)
        metrics = app.query_one(MetricsPane).view
        assert metrics is not None
        assert {c.chart.clip for c in metrics.cells} == {0.01}
        await pilot.press("o")
        await drawn(pilot)
        metrics = app.query_one(MetricsPane).view
        assert metrics is not None
        assert {c.chart.clip for c in metrics.cells} == {0.0}
