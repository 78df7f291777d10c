"""The one formatter: numbers, sizes, durations, and text from a run made literal."""

from __future__ import annotations

import math

from tuiwatch.analysis.format import duration, number, safe, size


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
        "0.01235",
        "1.5e-6",
        "123.5k",
        "nan",
        "inf",
        "-",
        "42",
    ]
    assert [size(v) for v in (512, 2048, 3 * 1024**3)] == ["512 B", "2.0 KiB", "3.0 GiB"]
    assert [duration(v) for v in (5, 125, 7500, 200000)] == ["5s", "2m05s", "2h05m", "2d07h"]


def test_a_clock_from_anywhere_is_written_short():
    assert duration(1.7e308) == "1.968e303d"  # not three hundred digits
    assert duration(200 * 86400) == "200d00h"
