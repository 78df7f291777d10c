"""The viewer's drawing maths: decimated series and charts, tested as the strings a pane shows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from rich.style import Style

from tuiwatch.analysis.format import fit, number, quantity
from tuiwatch.viewer.render.chart import _DOT as DOT
from tuiwatch.viewer.render.chart import LABEL_WIDTH, Trace, chart, smoothed
from tuiwatch.viewer.render.series import Column, Series

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"


def test_a_series_of_a_million_steps_stays_bounded_and_keeps_the_last_points_exact():
    series = Series(buckets=1024, recent=1000)
    for step in range(1_000_000):
        series.add(step, math.sin(step / 1000))
    assert len(series.buckets) <= 1024
    assert len(series.recent) == 1000
    assert [c.step for c in series.columns(999_900, 999_999, 200)] == list(range(999_900, 1_000_000))
    whole = series.columns(0, 999_999, 160)
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


def drawn(series: Series, width: int, height: int, log: bool = False, unit: str = "") -> list[str]:
    """The chart as a pane draws it, as plain text."""
    return [row.plain for row in chart([Trace(series, Style())], width, height, None, log, unit)]


def of(points: dict[int, float]) -> Series:
    series = Series()
    for step, value in points.items():
        series.add(step, value)
    return series


def test_a_rising_line_is_drawn_bottom_left_to_top_right():
    series = Series()
    for step in range(8):
        series.add(step, float(step))
    assert drawn(series, 12, 2) == [
        "      7┤⠀⠀⣠⠞",
        "      0┤⣠⠞⠁⠀",
    ]
    # From three rows, the last is the step axis: first and last step under their columns.
    assert drawn(series, 12, 3)[-1] == " " * LABEL_WIDTH + "0  7"


def test_log_scale_labels_are_powers_and_empty_charts_say_so():
    series = Series()
    for step, value in enumerate([1.0, 10.0, 100.0, 1000.0]):
        series.add(step, value)
    lines = drawn(series, 12, 4, log=True)
    assert lines[0].startswith("     1k┤")
    assert lines[-2].startswith("      1┤")
    assert drawn(Series(), 30, 3) == ["        (no data yet)", "", ""]
    assert drawn(Series(), 12, 3) == ["no data", "", ""]  # never a cut "(no "


def test_a_nearly_flat_series_gets_axis_labels_that_differ():
    series = Series()
    for step in range(50):
        series.add(step, 324_000_000 + step * 1000)
    lines = drawn(series, 30, 4)
    labels = [line.split("┤")[0].strip() for line in lines[:-1]]
    assert labels == ["324.05M", "324.02M", "324M"]


def cell_owners(rows: list[Any], traces: list[Trace]) -> list[list[int | None]]:
    """Per row, per cell after the labels: which trace's style the cell's dots are drawn in (None: blank)."""
    out = []
    for row in rows:
        owners: list[int | None] = [None] * (len(row.plain) - LABEL_WIDTH)
        for span in row.spans:
            for i in range(max(span.start, LABEL_WIDTH), span.end):
                if row.plain[i] != "\u2800":  # a blank cell draws nothing, whatever its style
                    owners[i - LABEL_WIDTH] = next((k for k, t in enumerate(traces) if t.style == span.style), None)
        out.append(owners)
    return out


def test_every_series_of_a_chart_shares_its_step_axis_and_evals_are_markers_over_the_line():
    train = of({step: 1.0 for step in range(0, 1001)})  # flat: every cell of one row
    evals = of({500: 1.0})  # one eval, half way, on the line
    traces = [Trace(train, Style(color="blue")), Trace(evals, Style(color="red"), markers=True)]
    rows = chart(traces, LABEL_WIDTH + 41, 4, None)
    owners = cell_owners(rows[:-1], traces)
    eval_cells = [(r, c) for r, row in enumerate(owners) for c, k in enumerate(row) if k == 1]
    assert eval_cells
    assert {c for _, c in eval_cells} == {20}
    train_row = next(r for r, row in enumerate(owners) if row.count(0) > 30)
    assert owners[train_row][19] == 0
    assert owners[train_row][21] == 0
    # The marker does not hide the line: the cell holds the union of both sets of dots.
    mark = ord(rows[train_row].plain[LABEL_WIDTH + 20]) - 0x2800
    line = ord(rows[train_row].plain[LABEL_WIDTH + 19]) - 0x2800
    assert mark & line == line
    assert rows[-1].plain.split() == ["0", "500", "1,000"]


def test_a_window_is_the_last_steps_of_the_whole_chart_not_of_each_series():
    train = of({step: float(step) for step in range(0, 2000)})
    evals = of({900: 5.0, 1950: 5.0})  # one eval before the window, one inside it
    traces = [Trace(train, Style(color="blue")), Trace(evals, Style(color="red"), markers=True)]
    rows = chart(traces, LABEL_WIDTH + 40, 6, 100)
    assert rows[-1].plain.split() == ["1,900", "1,949", "1,999"]
    owners = cell_owners(rows[:-1], traces)
    eval_columns = {c for row in owners for c, k in enumerate(row) if k == 1}
    assert eval_columns == {round(50 * 79 / 99) // 2}  # step 1950 → dot 40 of 80 → cell 20; 900 is not drawn


def test_value_labels_are_never_cut_into_another_number():
    series = of({0: 1.0, 1: 9.22e19})
    labels = [line.split("┤")[0].strip() for line in drawn(series, 20, 4)[:-1]]
    assert labels[0] == "9.22e19"
    assert labels[-1] == "1"
    for value in [10.0**e * m for e in range(-12, 31) for m in (1.0, 1.5, 9.999, -2.5)]:
        text = fit(value, LABEL_WIDTH - 1)
        assert len(text) <= LABEL_WIDTH - 1
        assert math.isclose(parse(text), value, rel_tol=0.5), (value, text)
    # Every float, in every unit, fits the gutter without an ellipsis (bare in its base unit at worst).
    extremes = [m * 10.0**e for e in range(-320, 308) for m in (1.0, -5.0, 9.99)] + [1.7976931348623157e308, -5e-324]
    for unit in ("", "s", "B"):
        for value in extremes:
            text = fit(value, LABEL_WIDTH - 1, unit, 3)
            assert len(text) <= LABEL_WIDTH - 1
            assert "…" not in text, (unit, value, text)


def parse(text: str) -> float:
    scale = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text)


def test_one_formatter_for_every_number_unit_aware():
    assert number(4.02e10) == "40.2G"  # not "4.02e+10G"
    assert number(2350.0, 3) == "2.35k"  # not "2.35e+03"
    assert number(0.1 + 0.2) == "0.3"  # not 16 digits
    assert number(1.234e-5) == "1.234e-5"
    assert number(9.22e19) == "9.22e19"
    assert number(float("nan")) == "nan"
    assert number(float("-inf")) == "-inf"
    assert quantity(0.0042, "s") == "4.2ms"
    assert quantity(0.00074, "s") == "740µs"
    assert quantity(327e6, "B") == "311.9MiB"
    assert fit(327e6, 7, "B") == "312MiB"


def test_timing_labels_are_in_time_units_and_byte_charts_have_a_minimum_span():
    waits = of({0: 0.004, 1: 0.0005})
    labels = [line.split("┤")[0].strip() for line in drawn(waits, 20, 4, unit="s")[:-1]]
    assert labels[0] == "4ms"
    assert labels[-1] == "500µs"
    rss = of({step: 300 * 2**20 + (step % 2) * 20_000 for step in range(100)})  # a 20 kB wiggle
    rows = drawn(rss, 30, 5, unit="B")
    labels = [line.split("┤")[0].strip() for line in rows[:-1]]
    assert labels[0] != labels[-1]
    assert all(label.endswith("MiB") for label in labels if label)
    # The wiggle is a flat line: its dots lie within one dot row (or two, where it sits on their boundary).
    heights = {
        4 * r + y
        for r, line in enumerate(rows[:-1])
        for ch in line.split("┤")[1]
        for x in (0, 1)
        for y in range(4)
        if (ord(ch) - 0x2800) & DOT[x][y]
    }
    assert max(heights) - min(heights) <= 1
    assert len({label for label in labels if label}) == len([label for label in labels if label])  # no repeats


def test_a_constant_series_is_labelled_with_its_value_on_its_own_row():
    lr = of({step: 0.1 for step in range(500)})
    for log in (False, True):
        rows = drawn(lr, 40, 9, log=log)[:-1]
        labelled = [r for r, line in enumerate(rows) if line.split("┤")[0].strip()]
        drawn_on = [r for r, line in enumerate(rows) if any(ch not in " ⠀" for ch in line.split("┤")[1])]
        assert [rows[r].split("┤")[0].strip() for r in labelled] == ["0.1"]  # not 0.0985 beside a line at 0.1
        assert labelled == drawn_on


def test_smoothing_is_a_debiased_moving_average_of_the_drawn_points():
    columns = [Column(x, x, v, v, v) for x, v in enumerate([1.0, 0.0, 0.0])]
    assert [c.value for c in smoothed(columns, 0.5)] == pytest.approx([1.0, 1 / 3, 1 / 7])
    assert [c.value for c in smoothed(columns, 0.0)] == [1.0, 0.0, 0.0]


def test_a_smoothed_noisy_line_is_drawn_through_the_middle_over_its_faint_raw_points():
    series = Series()
    for step in range(400):
        series.add(step, float(step % 2))  # 0, 1, 0, 1: a band from 0 to 1, its average 0.5
    line, faint = Style(color="red"), Style(color="red") + Style(dim=True)
    rows = chart([Trace(series, line, smooth=0.9)], 40, 9, None)[:-1]  # eight rows of dots, then the step axis
    # The right half of the chart, where the average has settled (debiased, it starts at the first point: 1).
    half = LABEL_WIDTH + 16
    owners: dict[int, set[Any]] = {}
    for r, row in enumerate(rows):
        for span in row.spans:
            if span.end > half and span.style in (line, faint):
                owners.setdefault(r, set()).add(span.style)
    assert owners[0] == {faint}  # the top and bottom rows: the raw points' alone
    assert owners[7] == {faint}
    assert {r for r, styles in owners.items() if line in styles} in ({3}, {4}, {3, 4})  # 0.5: the middle rows


def test_one_spike_left_off_the_range_is_marked_where_it_is_and_the_rest_keeps_its_height():
    series = Series()
    for step in range(200):
        series.add(step, 100.0 if step == 150 else 1.0 + (step % 10) / 10)  # 1.0 .. 1.9, and one spike
    whole = chart([Trace(series, Style())], 48, 6, None)
    assert whole[0].plain.startswith("    100┤")  # the spike sets the top: the rest is a flat line at the bottom
    clipped = [row.plain for row in chart([Trace(series, Style())], 48, 6, None, clip=0.01)]
    assert clipped[0].startswith("    1.9┤")
    assert clipped[0].count("↑") == 1
    spike_cell = round(150 / 199 * (40 * 2 - 1)) >> 1  # the spike's dot column, halved: its cell
    assert clipped[0][LABEL_WIDTH + spike_cell] == "↑"
    assert "↓" not in "".join(clipped)


def test_a_series_of_one_value_is_constant_and_one_that_moves_once_is_not():
    series = Series()
    assert not series.constant
    for step in range(500):
        series.add(step, 0.1)
    assert series.constant
    series.add(500, 0.01)
    assert not series.constant


def test_where_a_compared_run_parts_is_a_dotted_line_through_the_empty_cells_of_its_column():
    series = Series()
    for step in range(100):
        series.add(step, float(step))  # a diagonal: one cell of each column holds dots, the others are empty
    trace = [Trace(series, Style(color="blue"))]
    plain_rows = [r.plain for r in chart(trace, LABEL_WIDTH + 20, 6, None)]
    marked = chart(trace, LABEL_WIDTH + 20, 6, None, mark=50, mark_style=Style(color="magenta"))
    column = LABEL_WIDTH + round(50 * 39 / 99) // 2  # two dot columns a cell, 40 over steps 0-99
    for before, row in zip(plain_rows[:5], marked[:5], strict=True):
        cell = row.plain[column]
        assert cell == "┊" if before[column] == "\u2800" else cell == before[column]  # dots are never hidden
        assert row.plain[:column] + row.plain[column + 1 :] == before[:column] + before[column + 1 :]
    assert sum(r.plain[column] == "┊" for r in marked[:5]) == 4
    assert all(r.plain == b for r, b in zip(marked[5:], plain_rows[5:], strict=True))  # the step axis unchanged
    assert any(s.style == Style(color="magenta") and s.start <= column < s.end for s in marked[0].spans)
    off = chart(trace, LABEL_WIDTH + 20, 6, 10, mark=50)  # the last 10 steps: the mark is off the chart
    assert [r.plain for r in off] == [r.plain for r in chart(trace, LABEL_WIDTH + 20, 6, 10)]
