"""What the four panes share: a bordered, focusable widget that renders its own view, in its own styles."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.message import Message
from textual.widget import Widget

from tuiwatch.viewer.render.chart import LABEL_WIDTH, Trace, chart, step_range
from tuiwatch.viewer.views import Chart

WINDOWS: tuple[int | None, ...] = (None, 1000, 100)


def window_label(window: int | None, unit: str = "steps", short: bool = False) -> str:
    if short:
        return "all" if window is None else f"last {window // 1000}k" if window >= 1000 else f"last {window}"
    return f"all {unit}" if window is None else f"last {window:,} {unit}"


Piece = tuple[str, Style | str]


def fitted(width: int, *groups: Sequence[Piece], rank: Sequence[int] | None = None) -> Text:
    """One line of ``width`` cells made of whole groups: a group that does not fit is left out, never cut.

    A cut value is a different number (``step 251.0`` for 251.0 ms). Groups
    are kept in order of importance, ``rank[i]`` (lower first; default: the
    order given), and drawn in the order given.
    """
    order = sorted(range(len(groups)), key=lambda i: rank[i] if rank is not None else i)
    kept, used = set(), 0
    for i in order:
        need = sum(cell_len(part) for part, _ in groups[i])  # cells, not characters: a CJK run name is 2 a char
        if used + need <= width:
            kept.add(i)
            used += need
    text = Text(no_wrap=True, overflow="crop")
    for i, group in enumerate(groups):
        if i in kept:
            for part, style in group:
                text.append(part, style=style)
    return text


def step_at(c: Chart, width: int, x: int) -> int | None:
    """The step under column ``x`` of a chart ``width`` cells wide (as :func:`chart` places steps), or None in
    its value labels or where it has no steps."""
    steps = c.span or step_range([Trace(line.series, Style()) for line in c.lines], c.window)
    cells = width - LABEL_WIDTH
    if steps is None or cells < 1 or not LABEL_WIDTH <= x < width:
        return None
    dot = (x - LABEL_WIDTH) * 2 + 1  # the cell's right dot column
    first, last = steps
    return min(round(first + dot * (last - first) / max(cells * 2 - 1, 1)), last)


class Pane(Widget, can_focus=True):
    """A pane: the app sets its ``view`` (a reactive, frozen dataclass); it redraws only when that changes.

    Colours are component classes (``pane--<role>``) styled in tuiwatch.tcss,
    so a theme or a user stylesheet can change them.
    """

    COMPONENT_CLASSES = {"pane--dim", "pane--critical"}

    class StepClicked(Message):
        """A click on a chart: the app puts the cursor at that step."""

        def __init__(self, step: int) -> None:
            super().__init__()
            self.step = step

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = title

    def style_of(self, role: str) -> Style:
        return self.get_component_rich_style(f"pane--{role}")

    def value_style(self, value: float | None) -> Style | str:
        """A value's style: the critical colour when it is NaN or infinite (the news), else plain."""
        return self.style_of("critical") if value is not None and not math.isfinite(value) else ""

    def draw(self, c: Chart, width: int, height: int) -> list[Text]:
        traces = [Trace(line.series, self.style_of(line.role), line.markers, c.smooth) for line in c.lines]
        mark_style = self.style_of("compare") if c.mark is not None else "dim"
        return chart(
            traces, width, height, c.window, c.log, c.unit, c.span, c.clip, c.cursor, c.mark, mark_style, c.empty
        )
