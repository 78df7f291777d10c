"""What the four panes share: a bordered, focusable widget drawn from a RunState."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tuiwatch.viewer.render.chart import LABEL_WIDTH, axis_labels, plot
from tuiwatch.viewer.render.series import Series
from tuiwatch.viewer.state import RunState

WINDOWS: tuple[int | None, ...] = (None, 1000, 100)


def window_label(window: int | None) -> str:
    return "all steps" if window is None else f"last {window:,} steps"


class Pane(Widget, can_focus=True):
    """A pane shows a RunState; the app calls :meth:`show` and the pane redraws itself."""

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = title
        self.state = RunState()
        self.window: int | None = None
        self.now: float | None = None

    def show(self, state: RunState, window: int | None, now: float | None) -> None:
        self.state, self.window, self.now = state, window, now
        self.refresh()


def chart_lines(
    series: list[tuple[Series, str]], width: int, height: int, window: int | None, log: bool = False
) -> list[Text]:
    """A chart as rows of styled text: each series in its own colour, axis labels on the left."""
    if height < 1 or width <= LABEL_WIDTH + 2:
        return []
    cells = width - LABEL_WIDTH
    columns = [s.window(window, cells * 2) for s, _ in series]
    p = plot(columns, cells, height, log)
    if p is None:
        empty = "(no positive values)" if log and any(s.count for s, _ in series) else "(no data yet)"
        return [Text(" " * LABEL_WIDTH + empty, style="dim")] + [Text("")] * (height - 1)
    lines = []
    for label, row in zip(axis_labels(p, height), p.rows, strict=True):
        line = Text(label, style="dim")
        # One append per run of cells of the same series, not one per cell.
        run_owner, run_chars = row[0][1], list[str]()
        for ch, owner in row:
            if owner != run_owner:
                line.append("".join(run_chars), style=series[run_owner][1] if run_owner >= 0 else "")
                run_owner, run_chars = owner, []
            run_chars.append(ch)
        line.append("".join(run_chars), style=series[run_owner][1] if run_owner >= 0 else "")
        lines.append(line)
    return lines
