"""Stop is destructive: ask once."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from tuiwatch.analysis.format import safe


class ConfirmStop(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "yes, stop"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.run_name = name

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(f"Stop run {safe(self.run_name, 40)}?", style="bold"))
            yield Static(Text("It ends at the next step boundary.  y: stop   n / esc: cancel"))

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
