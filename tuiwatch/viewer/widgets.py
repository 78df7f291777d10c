"""Small widgets of the viewer that are not panes."""

from __future__ import annotations

from rich.segment import Segment
from textual.binding import Binding
from textual.color import Color
from textual.filter import LineFilter
from textual.message import Message
from textual.widgets import Input

from tuiwatch.viewer.render.ascii import ascii_only


class FilterInput(Input):
    """The metrics view's filter line: escape posts :class:`Cancelled` (enter is Input's own ``Submitted``)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    class Cancelled(Message):
        pass

    def action_cancel(self) -> None:
        self.post_message(self.Cancelled())


class AsciiFilter(LineFilter):
    """``--theme ascii``: every line Textual draws (panes, borders, dialogs, the footer, notifications,
    scrollbars), each character replaced by ASCII as wide (:mod:`tuiwatch.viewer.render.ascii`)."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        return [Segment(ascii_only(s.text), s.style, s.control) for s in segments]
