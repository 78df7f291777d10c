"""The metrics view (``m``): a chart for every numeric series of the run, as a grid that fits the pane, a page at a
time, filtered by name."""

from __future__ import annotations

import math

from rich.console import Group, RenderableType
from rich.text import Text
from textual import events
from textual.reactive import reactive

from tuiwatch.analysis.format import number, safe, seconds_short, size
from tuiwatch.viewer.panes.base import Pane, fitted, step_at, window_label
from tuiwatch.viewer.views import RANK_ROLES, MetricCell, MetricsView

CELL_MIN_WIDTH = 30  # a chart's value labels take 8 of them
CELL_HEIGHT = 7  # its title, 5 rows of dots and the step axis
GAP = 2


def grid_shape(width: int, height: int) -> tuple[int, int]:
    """Columns and rows of charts a pane of ``width`` × ``height`` cells holds (one line is the pane's own)."""
    columns = max(1, (width + GAP) // (CELL_MIN_WIDTH + GAP))
    return columns, max(1, (height - 1) // CELL_HEIGHT)


def pages(count: int, width: int, height: int) -> int:
    columns, rows = grid_shape(width, height)
    return max(1, math.ceil(count / (columns * rows)))


class MetricsPane(Pane):
    COMPONENT_CLASSES = {
        "pane--dim",
        "pane--critical",
        "pane--train",
        "pane--eval",
        "pane--lr",
        "pane--grad",
        "pane--wait",
        "pane--compute",
        "pane--memory",
        "pane--compare",
        *(f"pane--{r}" for r in RANK_ROLES),
    }
    view: reactive[MetricsView | None] = reactive(None)

    def __init__(self) -> None:
        super().__init__("metrics", id="metrics")

    def render(self) -> RenderableType:
        v = self.view
        if v is None:
            return Text("")
        width, height = self.content_region.width, self.content_region.height
        columns, rows = grid_shape(width, height)
        per_page = columns * rows
        count = pages(len(v.cells), width, height)
        page = min(max(v.page, 0), count - 1)
        shown = v.cells[page * per_page : (page + 1) * per_page]
        dim = self.style_of("dim")
        said = f"{len(v.cells)} of {v.total} metrics" if v.pattern else f"{v.total} metrics"
        window = v.cells[0].chart.window if v.cells else None
        status = fitted(
            width,
            [(said, "")],
            [(f"  page {page + 1}/{count}  [ ]", dim)] if count > 1 else [],
            [(f"  filter {safe(v.pattern, 30)}", dim)] if v.pattern else [],
            [(f"  {window_label(window, short=True)}", dim)],
            [("  / filter  m back", dim)],
        )
        lines: list[Text] = [status]
        if not shown:
            lines.append(Text("no metric matches the filter" if v.pattern else "no metrics yet", style=dim))
            return Group(*lines)
        cell_width = (width - GAP * (columns - 1)) // columns
        for start in range(0, len(shown), columns):
            drawn = [self._cell(cell, cell_width) for cell in shown[start : start + columns]]
            for i in range(CELL_HEIGHT):
                line = Text(no_wrap=True, overflow="crop")
                for j, cell_lines in enumerate(drawn):
                    if j:
                        line.append(" " * GAP)
                    part = cell_lines[i].copy() if i < len(cell_lines) else Text("")
                    part.truncate(cell_width, pad=True)
                    line.append_text(part)
                lines.append(line)
        return Group(*lines)

    def _cell(self, cell: MetricCell, width: int) -> list[Text]:
        role = cell.chart.lines[0].role
        unit = cell.chart.unit
        value = seconds_short(cell.value) if unit == "s" else size(cell.value) if unit == "B" else number(cell.value)
        title = fitted(
            width,
            [(safe(cell.name, width - 12) + " ", self.style_of(role))],
            [(value, self.value_style(cell.value))],
        )
        return [title, *self.draw(cell.chart, width, CELL_HEIGHT - 1)]

    def on_click(self, event: events.Click) -> None:
        """A click on a chart puts the cursor at the step under it (every chart here has the same steps)."""
        at = event.get_content_offset(self)
        v = self.view
        if at is None or v is None or not v.cells:
            return
        columns, _ = grid_shape(self.content_region.width, self.content_region.height)
        cell_width = (self.content_region.width - GAP * (columns - 1)) // columns
        step = step_at(v.cells[0].chart, cell_width, at.x % (cell_width + GAP))
        if step is not None:
            self.post_message(self.StepClicked(step))
