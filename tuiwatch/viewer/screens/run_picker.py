"""A small app that lists live runs and returns the one the user picks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from tuiwatch.analysis.format import safe
from tuiwatch.wire.discovery import LiveJob, LiveRun


def _who(run: LiveRun | LiveJob) -> str:
    if isinstance(run, LiveJob):
        return f"{len(run.ranks)}/{run.world_size} ranks"
    return f"pid {run.pid}"


def _where(run: LiveRun | LiveJob) -> str:
    """The run's directory (its socket where it has none): what tells apart two runs of one name in one process."""
    if isinstance(run, LiveJob):
        return ""
    return PurePath(run.ledger).parent.name if run.ledger else PurePath(run.socket).name


class RunPicker(App[LiveRun | LiveJob | None]):
    BINDINGS = [Binding("q,escape", "cancel", "quit")]

    def __init__(self, runs: Sequence[LiveRun | LiveJob]):
        super().__init__()
        self.runs = runs

    def compose(self) -> ComposeResult:
        yield Static("Several runs are live. Pick one (enter):")
        yield OptionList(
            *(
                Option(
                    # Rich Text, not a str: a name like "[reverse]x" is shown as written, never parsed as markup.
                    Text(
                        f"{safe(r.name, 40):<24} {_who(r):<12} step {'-' if r.step is None else r.step:<8} "
                        f"{safe(r.status, 20):<10} {safe(_where(r), 60)}"
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


def pick_run(runs: Sequence[LiveRun | LiveJob]) -> LiveRun | LiveJob | None:
    return RunPicker(runs).run()
