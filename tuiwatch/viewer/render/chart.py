"""Line charts in braille cells: 2×4 dots per character, with axes and labels.

Pure: series in, rows of Rich ``Text`` out (:func:`chart`); :func:`plot`
underneath places the dots as rows of (character, series index).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text

from tuiwatch.analysis.format import number
from tuiwatch.viewer.render.series import Column, Series

_BRAILLE = 0x2800
# Dot bits of a braille cell, by (column 0..1, row 0..3) from the top left.
_DOT = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
LABEL_WIDTH = 8


@dataclass(frozen=True)
class Plot:
    rows: list[list[tuple[str, int]]]  # per row, per cell: (character, series index or -1)
    lo: float
    hi: float
    log: bool


def _scale(value: float, log: bool) -> float | None:
    if log:
        return math.log10(value) if value > 0 else None
    return value


def bounds(series: Sequence[Sequence[Column]], log: bool) -> tuple[float, float] | None:
    values = [v for cols in series for c in cols for v in (_scale(c.lo, log), _scale(c.hi, log)) if v is not None]
    if not values:
        return None
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        pad = abs(hi) * 0.05 or 0.5
        lo, hi = lo - pad, hi + pad
    return lo, hi


def plot(series: Sequence[Sequence[Column]], width: int, height: int, log: bool = False) -> Plot | None:
    """Draw each series (its columns already decimated to ``2 * width``) into ``width``×``height`` cells."""
    if width < 1 or height < 1:
        return None
    b = bounds(series, log)
    if b is None:
        return None
    lo, hi = b
    dots_y = height * 4
    masks = [[[0] * width for _ in range(height)] for _ in series]

    def y_dot(v: float) -> int | None:
        s = _scale(v, log)
        if s is None:
            return None
        return min(dots_y - 1, max(0, round((hi - s) / (hi - lo) * (dots_y - 1))))

    def dot(k: int, x: int, top: int, bottom: int) -> None:
        for y in range(top, bottom + 1):
            masks[k][y // 4][x // 2] |= _DOT[x % 2][y % 4]

    dots_x = width * 2
    for k, cols in enumerate(series):
        n = len(cols)
        prev: tuple[int, int] | None = None  # (x, y) of the previous point's last value
        for i, c in enumerate(cols):
            x = i * dots_x // n if n > 1 else 0
            top, bottom, end = y_dot(c.hi), y_dot(c.lo), y_dot(c.value)
            if top is None or bottom is None or end is None:
                prev = None
                continue
            if prev is not None:
                # Join to the previous point: a straight run over skipped dot
                # columns, or a vertical stroke between adjacent ones.
                px, py = prev
                mid = (top + bottom) // 2
                for gx in range(px + 1, x):
                    gy = py + (mid - py) * (gx - px) // (x - px)
                    dot(k, gx, gy, gy)
                if x == px + 1:
                    top, bottom = min(top, py), max(bottom, py)
            dot(k, x, top, bottom)
            prev = (x, end)
    rows = []
    for r in range(height):
        row = []
        for col in range(width):
            mark, owner = 0, -1
            for k in range(len(series)):
                if masks[k][r][col]:
                    mark |= masks[k][r][col]
                    owner = k  # later series draw on top
            row.append((chr(_BRAILLE + mark), owner))
        rows.append(row)
    return Plot(rows, lo, hi, log)


def axis_labels(p: Plot, height: int) -> list[str]:
    """Left labels: the top value on the first row, the bottom on the last, one in the middle."""
    labels = [""] * height

    def value(frac: float) -> float:
        v = p.hi - frac * (p.hi - p.lo)
        return 10**v if p.log else v

    # Enough digits that the top and bottom labels differ (a nearly flat series).
    digits = next((d for d in range(3, 9) if number(value(0.0), d) != number(value(1.0), d)), 3)

    def at(frac: float) -> str:
        return number(value(frac), digits)

    labels[0] = at(0.0)
    if height >= 3:
        labels[height // 2] = at((height // 2 * 4 + 1.5) / (height * 4 - 1))
    if height >= 2:
        labels[-1] = at(1.0)
    return [label.rjust(LABEL_WIDTH - 1)[: LABEL_WIDTH - 1] + "┤" for label in labels]


def chart(
    lines: Sequence[tuple[Series, Style]], width: int, height: int, window: int | None, log: bool = False
) -> list[Text]:
    """A chart as ``height`` rows of styled text: each series in its own style, axis labels on the left.

    What a pane draws, and what the tests read (``.plain``): one path. The
    series are decimated to two columns of dots per cell of the ``width``.
    """
    if height < 1 or width <= LABEL_WIDTH + 2:
        return []
    cells = width - LABEL_WIDTH
    p = plot([s.window(window, cells * 2) for s, _ in lines], cells, height, log)
    if p is None:
        empty = "(no positive values)" if log and any(s.count for s, _ in lines) else "(no data yet)"
        return [Text(" " * LABEL_WIDTH + empty, style="dim")] + [Text("")] * (height - 1)
    rows = []
    for label, row in zip(axis_labels(p, height), p.rows, strict=True):
        text = Text(label, style="dim")
        # One append per run of cells of the same series, not one per cell.
        owner, run = row[0][1], list[str]()
        for ch, cell_owner in row:
            if cell_owner != owner:
                text.append("".join(run), style=lines[owner][1] if owner >= 0 else "")
                owner, run = cell_owner, []
            run.append(ch)
        text.append("".join(run), style=lines[owner][1] if owner >= 0 else "")
        rows.append(text)
    return rows
