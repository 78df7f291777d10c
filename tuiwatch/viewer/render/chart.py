"""Line charts in braille cells: 2×4 dots per character, with a value axis, a step axis and labels.

Pure: traces in, rows of Rich ``Text`` out (:func:`chart`); :func:`plot`
underneath places the dots as rows of (character, trace index). Every trace of
a chart shares one step axis (the chart's first to last step) and one value
axis; labels are never cut, so a label is always the number it stands for.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text

from tuiwatch.analysis.format import fit
from tuiwatch.viewer.render.series import Column, Series

_BRAILLE = 0x2800
_BLANK = chr(_BRAILLE)  # a cell without dots
# Dot bits of a braille cell, by (column 0..1, row 0..3) from the top left.
_DOT = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
LABEL_WIDTH = 8  # seven characters of value, then the axis
NO_DATA = "(no data yet)"  # what a chart says with no point to draw, unless told otherwise
MIB = float(2**20)


@dataclass(frozen=True)
class Trace:
    """One series as a chart draws it: a line, or markers (evals: a few points that must not hide the line).

    ``smooth`` > 0: the line's exponential moving average with that weight is
    drawn in its style over its raw points, drawn faint (:func:`smoothed`).
    """

    series: Series
    style: Style
    markers: bool = False
    smooth: float = 0.0


def smoothed(columns: Sequence[Column], weight: float) -> list[Column]:
    """The exponential moving average of the columns' values, debiased at the start (as TensorBoard smooths):
    ``s = weight * s + (1 - weight) * v``, divided by ``1 - weight ** n`` after ``n`` values. It runs over
    the points drawn, a column's last value each (the whole run's points are not all kept)."""
    out, average = [], 0.0
    for n, c in enumerate(columns, start=1):
        average = weight * average + (1 - weight) * c.value
        value = average / (1 - weight**n)
        out.append(Column(c.x, c.step, value, value, value))
    return out


@dataclass(frozen=True)
class Plot:
    rows: list[list[tuple[str, int]]]  # per row, per cell: (character, trace index or -1)
    lo: float
    hi: float
    log: bool
    flat: tuple[float, int] | None = None  # every point one value: (that value, the row it is drawn in)


def _scale(value: float, log: bool) -> float | None:
    if log:
        return math.log10(value) if value > 0 else None
    return value


def min_span(unit: str, top: float) -> float:
    """The smallest value range a chart shows: bytes get 5 % of their top (at least 1 MiB), so a
    20 kB wiggle in 300 MiB of RSS is a flat line, not a cliff."""
    return max(MIB, 0.05 * abs(top)) if unit == "B" else 0.0


def bounds(
    series: Sequence[Sequence[Column]], log: bool, unit: str = "", clip: float = 0.0
) -> tuple[float, float] | None:
    """The value range drawn: every column's lows and highs, or with ``clip`` > 0 all but that fraction of the
    highest and of the lowest (one spike then does not flatten the rest; :func:`chart` marks what is off)."""
    values = [v for cols in series for c in cols for v in (_scale(c.lo, log), _scale(c.hi, log)) if v is not None]
    if not values:
        return None
    lo, hi = min(values), max(values)
    cut = int(len(values) * clip)
    if cut:
        ordered = sorted(values)
        lo, hi = ordered[cut], ordered[-1 - cut]
    span = 0.0 if log else min_span(unit, hi)
    if hi - lo < span:
        lo = max(0.0, (lo + hi - span) / 2) if lo >= 0 else (lo + hi - span) / 2
        hi = lo + span
    if hi - lo < 1e-12:
        pad = max(abs(hi) * 0.05, 1e-12) if hi else 0.5
        lo, hi = max(lo - pad, -sys.float_info.max), min(hi + pad, sys.float_info.max)
    return lo, hi


def plot(
    series: Sequence[Sequence[Column]],
    width: int,
    height: int,
    log: bool = False,
    markers: Sequence[bool] = (),
    unit: str = "",
    clip: float = 0.0,
) -> Plot | None:
    """Draw each trace's columns (x in dots, ``0 .. 2 * width - 1``) into ``width``×``height`` cells.

    A line joins its points; a marker trace draws each point as a 2×2 blob.
    Where a marker and a line share a cell, both sets of dots are drawn and the
    marker's colour wins: the line keeps its shape, the marker stays visible.
    """
    if width < 1 or height < 1:
        return None
    b = bounds(series, log, unit, clip)
    if b is None:
        return None
    lo, hi = b
    dots_y = height * 4
    # In halves: the span of values near the largest float would overflow to inf.
    half_hi, per_dot = hi / 2, (dots_y - 1) / (hi / 2 - lo / 2)
    # One flat mask per trace (cell = row * width + column): this runs for every chart at every frame.
    masks = [[0] * (width * height) for _ in series]
    marker_of = [k < len(markers) and markers[k] for k in range(len(series))]

    def y_dot(v: float) -> int | None:
        s = _scale(v, log) if log else v
        if s is None:
            return None
        y = (half_hi - s / 2) * per_dot + 0.5
        if not y < dots_y:  # past the bottom, or NaN from a range at the ends of the float type
            return dots_y - 1 if y == y else dots_y // 2
        return 0 if y < 0 else int(y)

    def dot(mask: list[int], x: int, top: int, bottom: int) -> None:
        bits, column = _DOT[x & 1], x >> 1
        for y in range(top, bottom + 1):
            mask[(y >> 2) * width + column] |= bits[y & 3]

    for k, cols in enumerate(series):
        mask = masks[k]
        prev: tuple[int, int] | None = None  # (x, y) of the previous point's last value
        for c in cols:
            x = c.x
            top, bottom, end = y_dot(c.hi), y_dot(c.lo), y_dot(c.value)
            if top is None or bottom is None or end is None:
                prev = None
                continue
            if marker_of[k]:
                x0, y2 = x - x % 2, end + 1 if end % 4 != 3 else end - 1
                for mx in (x0, x0 + 1):
                    dot(mask, mx, min(end, y2), max(end, y2))
                continue
            if prev is not None:
                # Join to the previous point: a straight run over skipped dot
                # columns, or a vertical stroke between adjacent ones.
                px, py = prev
                mid = (top + bottom) // 2
                for gx in range(px + 1, x):
                    gy = py + (mid - py) * (gx - px) // (x - px)
                    dot(mask, gx, gy, gy)
                if x == px + 1:
                    top, bottom = min(top, py), max(bottom, py)
            dot(mask, x, top, bottom)
            prev = (x, end)
    rows = []
    order = sorted(range(len(series)), key=lambda k: marker_of[k])  # lines first; a marker's colour wins
    for r in range(height):
        row = []
        for cell in range(r * width, (r + 1) * width):
            mark, owner = 0, -1
            for k in order:
                bits = masks[k][cell]
                if bits:
                    mark |= bits
                    owner = k  # later lines draw on top; a marker over any line
            row.append((chr(_BRAILLE + mark), owner))
        rows.append(row)
    values = {v for cols in series for c in cols for v in (c.lo, c.hi)}
    flat_y = y_dot(next(iter(values))) if len(values) == 1 else None
    flat = (next(iter(values)), flat_y // 4) if flat_y is not None else None
    return Plot(rows, lo, hi, log, flat)


def _mark_clipped(p: Plot, columns: Sequence[Sequence[Column]], log: bool) -> None:
    """An arrow in the top row over a column with a value above the range, in the bottom row under one below."""
    top, bottom = p.rows[0], p.rows[-1]
    for k, cols in enumerate(columns):
        for c in cols:
            hi, lo = _scale(c.hi, log), _scale(c.lo, log)
            if hi is not None and hi > p.hi:
                top[c.x >> 1] = ("↑", k)
            if lo is not None and lo < p.lo:
                bottom[c.x >> 1] = ("↓", k)


def axis_labels(p: Plot, height: int, unit: str = "") -> list[str]:
    """Left labels: the top value on the first row, the bottom on the last, one in the middle if it differs;
    for a flat series, only its value, on its row."""
    labels = [""] * height
    width = LABEL_WIDTH - 1
    if p.flat is not None:
        # One value throughout (a constant lr): its own label on the row it is drawn in, not the axis's
        # round numbers around it (a line at 0.1 beside a label 0.0985 reads as 0.0985).
        value_at, row = p.flat
        labels[row] = fit(value_at, width, unit)
        return [label.rjust(width) + "┤" for label in labels]

    def value(frac: float) -> float:
        v = p.lo + (1.0 - frac) * (p.hi - p.lo)  # exactly lo at the bottom: hi - (hi - lo) may round to 0
        return 10 ** min(v, 308.0) if p.log else v  # a padded log axis may reach past the largest float

    # The fewest digits (3 or more) at which the top and bottom labels differ (a nearly flat series).
    digits = next((d for d in range(3, 7) if fit(value(0.0), width, unit, d) != fit(value(1.0), width, unit, d)), 3)

    def at(frac: float) -> str:
        return fit(value(frac), width, unit, digits)

    labels[0] = at(0.0)
    if height >= 2:
        labels[-1] = at(1.0)
    if height >= 3:
        middle = at((height // 2 * 4 + 1.5) / (height * 4 - 1))
        labels[height // 2] = middle if middle not in (labels[0], labels[-1]) else ""
    return [label.rjust(width) + "┤" for label in labels]


def step_label(step: int, room: int) -> str:
    """A step for the x axis: exact (``12,345``) where it fits, else short (``12.3k``)."""
    exact = f"{step:,}"
    return exact if len(exact) <= room else fit(step, room)


def step_axis(start: int, end: int, cells: int) -> Text:
    """The row under a chart: its first step at the left, its last at the right, the middle one where it fits."""
    row = [" "] * cells
    first = step_label(start, max(cells // 3, 1))
    row[: len(first)] = first
    if end != start:
        last = step_label(end, max(cells // 3, 1))
        row[cells - len(last) :] = last
        middle_step = (start + end) // 2
        middle = step_label(middle_step, max(cells // 3, 1))
        x = round((middle_step - start) * (cells - 1) / (end - start)) - len(middle) // 2
        if len(first) + 2 <= x and x + len(middle) + 2 <= cells - len(last) and middle_step not in (start, end):
            row[x : x + len(middle)] = middle
    return Text(" " * LABEL_WIDTH + "".join(row)[:cells], no_wrap=True)


def step_range(traces: Sequence[Trace], window: int | None) -> tuple[int, int] | None:
    """The chart's shared step axis: from its first drawn step (or ``window`` before the last) to its last."""
    ends = [e for t in traces if (e := t.series.end_step) is not None]
    firsts = [f for t in traces if (f := t.series.first_step) is not None]
    if not ends or not firsts:
        return None
    return window_span(min(firsts), max(ends), window)


def window_span(first: int, last: int, window: int | None) -> tuple[int, int]:
    """The steps a chart shows of ``first`` .. ``last``: all of them, or the last ``window``."""
    return (first if window is None else max(last - window + 1, first)), last


def cell_of(step: int | None, steps: tuple[int, int], cells: int) -> int | None:
    """The cell of a chart ``cells`` wide over ``steps`` that ``step`` is drawn in, None off the chart."""
    if step is None or not steps[0] <= step <= steps[1]:
        return None
    scale = (cells * 2 - 1) / (steps[1] - steps[0]) if steps[1] > steps[0] else 0.0
    return int((step - steps[0]) * scale + 0.5) >> 1


def chart(
    traces: Sequence[Trace],
    width: int,
    height: int,
    window: int | None,
    log: bool = False,
    unit: str = "",
    span: tuple[int, int] | None = None,
    clip: float = 0.0,
    cursor: int | None = None,
    mark: int | None = None,
    mark_style: Style | str = "dim",
    empty: str = NO_DATA,
) -> list[Text]:
    """A chart as ``height`` rows of styled text: value labels on the left, the step axis on the last row.

    What a pane draws, and what the tests read (``.plain``): one path. Every
    trace is placed on the chart's one step axis, two columns of dots per
    cell of the ``width``; ``span`` (first, last step) sets that axis where
    several charts share one (the metrics view), else the traces' own steps do.
    ``unit`` ("", "s", "B") formats the value labels. ``clip`` > 0 leaves
    that fraction of the highest and the lowest values off the value range
    (:func:`bounds`); a cell with a value above the chart says ``↑`` in its
    top row, one below it ``↓`` in its bottom row. ``cursor`` (a step) is
    drawn as its column in reverse video. ``mark`` (a step: where a compared
    run parts) is a dotted vertical line in ``mark_style`` through the cells
    of its column that have no dots, so that it hides no point. ``empty`` is what it says with no point to draw.
    """
    if height < 1 or width <= LABEL_WIDTH + 2:
        return []
    cells = width - LABEL_WIDTH
    steps = span if span is not None and any(t.series.count for t in traces) else step_range(traces, window)
    plot_h = height - 1 if height >= 3 else height
    p = None
    styles: list[Style | str] = [t.style for t in traces]
    if steps is not None:
        columns = [t.series.columns(steps[0], steps[1], cells * 2) for t in traces]
        markers = [t.markers for t in traces]
        for k, t in enumerate(traces):
            if t.smooth > 0 and not t.markers and columns[k]:
                # The raw points faint, the average on top in the line's own colour.
                styles[k] = t.style + Style(dim=True)
                columns.append(smoothed(columns[k], t.smooth))
                markers.append(False)
                styles.append(t.style)
        p = plot(columns, cells, plot_h, log, markers, unit, clip)
        if p is not None and clip > 0:
            _mark_clipped(p, columns, log)
    if steps is None or p is None:
        empty = "(no positive values)" if log and any(t.series.count for t in traces) else empty
        said = next(t for t in (" " * LABEL_WIDTH + empty, empty, "no data", "-") if len(t) <= width)
        return [Text(said, style="dim", no_wrap=True)] + [Text("")] * (height - 1)
    at, marked = cell_of(cursor, steps, cells), cell_of(mark, steps, cells)
    if marked is not None:
        styles.append(mark_style)
        for row in p.rows:
            if row[marked][0] == _BLANK:
                row[marked] = ("┊", len(styles) - 1)
    rows = []
    for label, row in zip(axis_labels(p, plot_h, unit), p.rows, strict=True):
        # The label is dim; the line keeps its own colour (a dim base style would dim it too).
        text = Text(no_wrap=True)
        text.append(label, style="dim")
        # One append per run of cells of the same trace, not one per cell; a blank cell joins any run.
        owner, run = row[0][1], list[str]()
        for ch, cell_owner in row:
            if cell_owner >= 0 and cell_owner != owner:
                if owner >= 0:
                    text.append("".join(run), style=styles[owner])
                    run = []
                owner = cell_owner  # blanks before it take its style: they draw nothing
            run.append(ch)
        text.append("".join(run), style=styles[owner] if owner >= 0 else "")
        if at is not None:
            text.stylize("reverse", LABEL_WIDTH + at, LABEL_WIDTH + at + 1)
        rows.append(text)
    if plot_h < height:
        axis = step_axis(steps[0], steps[1], cells)
        axis.stylize("dim")
        rows.append(axis)
    return rows
