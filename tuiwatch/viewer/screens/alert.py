"""``enter`` on an alert: the alert whole, with its evidence, on a screen of its own (text to select and copy)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tuiwatch.analysis.format import safe
from tuiwatch.viewer.views import AlertRow


def alert_text(row: AlertRow) -> Text:
    """The alert's lines: what, where, what to look at, the dump and the evidence; every string made safe."""
    a = row.alert
    text = Text()
    text.append(f"{a.severity} · {safe(a.rule, 40)}", style="bold")
    text.append(f" · step {'-' if a.step is None else a.step}")
    if a.rank is not None:
        text.append(f" · rank {a.rank}")
    text.append("\n\n" + safe(a.message, 2000) + "\n")
    if a.next_check:
        text.append("\nlook at: " + safe(a.next_check, 2000) + "\n")
    if row.count > 1:
        steps = ", ".join("-" if s is None else str(s) for s in row.steps)
        text.append(f"\n{row.count} in a row of this rule, at steps {safe(steps, 2000)} (the newest shown)\n")
    if a.samples:
        text.append("\nnon-finite samples: " + ", ".join(map(str, a.samples)) + "\n")
    if a.dump:
        text.append("\ndump: ", style="dim")
        text.append(safe(a.dump, 1000) + "\n")
    if a.evidence:
        text.append("\nevidence\n", style="dim")
        # json_text already wrote control characters as escapes; safe() would turn its newlines into one line.
        text.append(a.evidence + "\n")
    return text


class AlertScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,enter", "close", "close")]

    def __init__(self, row: AlertRow) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="info"):
            yield Static(alert_text(self.row))
            yield Static(Text("esc: close", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)
