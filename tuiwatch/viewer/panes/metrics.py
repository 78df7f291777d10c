"""The metrics view (``m``): a chart for every numeric series of the run, as a grid that fits the pane, a page at a
time, filtered by name."""

from __future__ import annotations

from collections.abc import Sequence

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


Band = tuple[MetricCell, ...]  # a row of the grid: charts side by side, or constants' one-line cells


def layout(cells: Sequence[MetricCell], width: int, height: int) -> list[list[Band]]:
    """The pages of the grid: its charts in rows of as many as fit, then the constant series, each one line (a
    chart of one value says nothing its title does not), as many across as charts are; a page holds the rows
    that fit in ``height`` (one line is the pane's own), at least one."""
    columns, _ = grid_shape(width, height)
    charts = [c for c in cells if not c.constant]
    constants = [c for c in cells if c.constant]
    bands = [tuple(charts[i : i + columns]) for i in range(0, len(charts), columns)]
    bands += [tuple(constants[i : i + columns]) for i in range(0, len(constants), columns)]
    pages: list[list[Band]] = [[]]
    room = height - 1
    for band in bands:
        need = 1 if band[0].constant else CELL_HEIGHT
        if pages[-1] and need > room:
            pages.append([])
            room = height - 1
        pages[-1].append(band)
        room -= need
    return pages


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
        columns, _ = grid_shape(width, height)
        paged = layout(v.cells, width, height)
        count = len(paged)
        page = min(max(v.page, 0), count - 1)
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
        if not v.cells:
            lines.append(Text("no metric matches the filter" if v.pattern else "no metrics yet", style=dim))
            return Group(*lines)
        cell_width = (width - GAP * (columns - 1)) // columns
        for band in paged[page]:
            drawn = [self._cell(cell, cell_width) for cell in band]
            for i in range(max(len(d) for d in drawn)):
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
            [(" constant", self.style_of("dim"))] if cell.constant else [],
        )
        return [title] if cell.constant else [title, *self.draw(cell.chart, width, CELL_HEIGHT - 1)]

    def on_click(self, event: events.Click) -> None:
        """A click on a chart puts the cursor at the step under it (every chart here has the same steps)."""
        at = event.get_content_offset(self)
        v = self.view
        if at is None or v is None or not v.cells:
            return
        width, height = self.content_region.width, self.content_region.height
        paged = layout(v.cells, width, height)
        y = at.y - 1  # under the pane's own line
        for band in paged[min(max(v.page, 0), len(paged) - 1)]:
            rows = 1 if band[0].constant else CELL_HEIGHT
            if y < rows:
                if band[0].constant:
                    return  # a constant's line has no steps to click
                break
            y -= rows
        columns, _ = grid_shape(width, height)
        cell_width = (width - GAP * (columns - 1)) // columns
        step = step_at(v.cells[0].chart, cell_width, at.x % (cell_width + GAP))
        if step is not None:
            self.post_message(self.StepClicked(step))
