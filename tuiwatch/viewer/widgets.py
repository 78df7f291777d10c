"""Small widgets and screens of the viewer that are not panes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from tuiwatch.analysis.format import duration, safe
from tuiwatch.viewer.state import RunState

STATUS_STYLE = {
    "live": "bold green",
    "paused": "bold yellow",
    "degraded": "bold yellow",
    "connecting": "dim",
    "disconnected": "bold red",
    "finished": "bold blue",
    "stopped": "bold magenta",
}


def header_text(state: RunState, now: float | None, mode: str) -> Text:
    run = state.run
    text = Text()
    text.append(" tuiwatch ", style="bold reverse")
    text.append(f" {safe(state.name, 40)}", style="bold")
    if run.get("host"):
        text.append(f"@{safe(run.get('host'), 30)}", style="dim")
    text.append(f"  step {'-' if state.step is None else f'{state.step:,}'}")
    text.append(f"  epoch {'-' if state.epoch is None else state.epoch}")
    text.append(f"  {duration(state.elapsed(now))}")
    text.append("  ")
    text.append(f"● {state.status}", style=STATUS_STYLE.get(state.status, ""))
    if mode != "live":
        text.append(f"  [{mode}]", style="dim")
    return text


class HeaderBar(Static):
    """One line: run name, host, step, epoch, elapsed, status."""


class ConfirmStop(ModalScreen[bool]):
    """Stop is destructive: ask once."""

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


HELP = """\
c   checkpoint: the run writes a checkpoint and a dump of the batch, and goes on
d   dump: the run writes a dump of the current batch
p   pause / resume the run at the next step boundary
s   stop the run (asks first)
w   chart window: all steps / last 1,000 / last 100
f   full-screen the focused pane (f again to go back)
tab focus the next pane
?   this help
q   quit the viewer (the run goes on)

Commands need a live run: replay is read-only."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text("keys", style="bold"))
            yield Static(Text(HELP))

    def action_close(self) -> None:
        self.dismiss(None)
