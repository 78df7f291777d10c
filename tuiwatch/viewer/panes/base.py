"""What the four panes share: a bordered, focusable widget that renders its own view, in its own styles."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from tuiwatch.viewer.render.chart import chart
from tuiwatch.viewer.views import Chart

WINDOWS: tuple[int | None, ...] = (None, 1000, 100)


def window_label(window: int | None, unit: str = "steps") -> str:
    return f"all {unit}" if window is None else f"last {window:,} {unit}"


class Pane(Widget, can_focus=True):
    """A pane: the app sets its ``view`` (a reactive, frozen dataclass); it redraws only when that changes.

    Colours are component classes (``pane--<role>``) styled in tuiwatch.tcss,
    so a theme or a user stylesheet can change them.
    """

    COMPONENT_CLASSES = {"pane--dim"}

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = title

    def style_of(self, role: str) -> Style:
        return self.get_component_rich_style(f"pane--{role}")

    def draw(self, c: Chart, width: int, height: int) -> list[Text]:
        return chart([(line.series, self.style_of(line.role)) for line in c.lines], width, height, c.window, c.log)
