"""``i``: the run record and the latest system record, on a screen of their own."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class RunInfoScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,i", "close", "close")]

    def __init__(self, lines: list[tuple[str, str]]) -> None:
        super().__init__()
        self.lines = lines

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="dim", no_wrap=True)
        table.add_column(overflow="fold")
        for label, value in self.lines:
            table.add_row(Text(label), Text(value))  # Text: a value is never read as markup
        with VerticalScroll(id="info"):
            yield Static(Text("run", style="bold"))
            yield Static(table if self.lines else Text("no run record yet", style="dim"))
            yield Static(Text("i / esc: close", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)
