"""Small widgets of the viewer that are not panes."""

from __future__ import annotations

from rich.segment import Segment
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input, Static

from tuiwatch.viewer.render.ascii import ascii_only


class AsciiSafe(Widget):
    """A widget that draws only ASCII when the app says ``ascii_only`` (``--theme ascii``): its text, its border
    and its title, each character replaced by ASCII as wide (:mod:`tuiwatch.viewer.render.ascii`)."""

    def on_mount(self) -> None:
        if getattr(self.app, "ascii_only", False):
            # Scrollbars are drawn in block characters: none, here and on the screen (a dialog taller than the
            # terminal scrolls its screen). The keys and the wheel still scroll.
            for styles in (self.styles, self.screen.styles):
                styles.scrollbar_size_vertical = 0
                styles.scrollbar_size_horizontal = 0

    def render_lines(self, crop: Region) -> list[Strip]:
        lines = super().render_lines(crop)
        if not getattr(self.app, "ascii_only", False):
            return lines
        return [
            Strip([Segment(ascii_only(s.text), s.style, s.control) for s in line], line.cell_length) for line in lines
        ]


# AsciiSafe after the Textual class: Textual takes a widget's default CSS along its first base only.
class Said(Static, AsciiSafe):
    """A dialog's text."""


class Dialog(Vertical, AsciiSafe):
    """A dialog's frame."""


class ScrollingDialog(VerticalScroll, AsciiSafe):
    """A dialog's frame that scrolls (a long alert, the run's settings)."""


class FilterInput(Input):
    """The metrics view's filter line: escape posts :class:`Cancelled` (enter is Input's own ``Submitted``)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    class Cancelled(Message):
        pass

    def action_cancel(self) -> None:
        self.post_message(self.Cancelled())
