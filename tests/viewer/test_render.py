"""The viewer's drawing maths: decimated series and charts, tested as the strings a pane shows."""

from __future__ import annotations

import math
from pathlib import Path

from rich.style import Style

from tuiwatch.viewer.render.chart import chart
from tuiwatch.viewer.render.series import Series

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"


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


def test_a_nearly_flat_series_gets_axis_labels_that_differ():
    series = Series()
    for step in range(50):
        series.add(step, 324_000_000 + step * 1000)
    lines = drawn(series, 30, 3)
    labels = [line.split("┤")[0].strip() for line in lines]
    assert labels == ["324.05M", "324.02M", "324M"]
