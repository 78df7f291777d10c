"""Small widgets of the viewer that are not panes."""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input


class FilterInput(Input):
    """The metrics view's filter line: escape posts :class:`Cancelled` (enter is Input's own ``Submitted``)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    class Cancelled(Message):
        pass

    def action_cancel(self) -> None:
        self.post_message(self.Cancelled())
