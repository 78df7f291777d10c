"""The keys, on ``?``."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
c   checkpoint: the run writes a checkpoint and a dump of the batch, and goes on
d   dump: the run writes a dump of the current batch
p   pause / resume the run at the next step boundary
s   stop the run (asks first)
w   chart window: all steps / last 1,000 / last 100
+ - zoom every chart in / out (or the mouse wheel); ← → move; 0 follow the run again
.   a cursor: every chart's value at one step (← → move it)
f   full-screen the focused pane (f again to go back)
i   the run: how it was started and watched, and its machine now
x   save the screen as an SVG (in the run directory when it is on this host)
e   moving average over the loss: off / 0.6 / 0.9 / 0.99     y  log value axis
o   leave the top and bottom 1% off the loss's value range (↑ ↓ mark them)
m   every metric as a grid of charts (m again: back)
      /  filter them by name (glob or regex)   [ ]  page
tab focus the next pane; in alerts: ↑ ↓ select, 1 2 3 criticals / warnings / all,
    enter the alert whole
?   this help
q   {quit}

Commands need a live run: replay is read-only."""
QUIT = "quit the viewer (the run goes on)"


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "close")]

    def __init__(self, quit_does: str = QUIT) -> None:
        super().__init__()
        self.quit_does = quit_does

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text("keys", style="bold"))
            yield Static(Text(HELP.format(quit=self.quit_does)))

    def action_close(self) -> None:
        self.dismiss(None)
