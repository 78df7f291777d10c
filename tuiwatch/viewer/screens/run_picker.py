"""A small app that lists live runs and returns the one the user picks."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from tuiwatch.analysis.format import safe
from tuiwatch.wire.discovery import LiveRun


class RunPicker(App[LiveRun | None]):
    BINDINGS = [Binding("q,escape", "cancel", "quit")]

    def __init__(self, runs: list[LiveRun]):
        super().__init__()
        self.runs = runs

    def compose(self) -> ComposeResult:
        yield Static("Several runs are live. Pick one (enter):")
        yield OptionList(
            *(
                Option(
                    # Rich Text, not a str: a name like "[reverse]x" is shown as written, never parsed as markup.
                    Text(
                        f"{safe(r.name, 40):<24} pid {r.pid:<8} step {'-' if r.step is None else r.step:<8} "
                        f"{safe(r.status, 20)}"
                    ),
                    id=str(i),
                )
                for i, r in enumerate(self.runs)
            )
        )
        yield Footer()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.exit(self.runs[int(event.option.id or 0)])

    def action_cancel(self) -> None:
        self.exit(None)


def pick_run(runs: list[LiveRun]) -> LiveRun | None:
    return RunPicker(runs).run()
