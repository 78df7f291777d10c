"""The header line: run name, host, step, epoch, elapsed, status, and the newest alert."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tuiwatch.analysis.format import duration, safe
from tuiwatch.viewer.panes.base import Piece, fitted
from tuiwatch.viewer.views import HeaderView

STATUSES = ("live", "paused", "degraded", "connecting", "disconnected", "finished", "stopped", "failed")


def status_text(v: HeaderView) -> tuple[str, str]:
    """What the status says, and the status whose colour it takes."""
    if v.loading is not None:
        return f"loading {v.loading}%", "connecting"
    step = "" if v.step is None else f" at step {v.step:,}"
    if v.status == "failed":
        return f"stopped: {v.end_reason}{step}", "failed"
    if v.status == "stopped":
        return f"stopped by request{step}", "stopped"
    if v.status == "disconnected" and v.mode == "replay":
        return f"no end record{step} (killed?)", "failed"
    return v.status, v.status


class HeaderBar(Widget):
    COMPONENT_CLASSES = {
        "header--title",
        "header--name",
        "header--dim",
        "header--critical",
        "header--warning",
        *(f"header--{s}" for s in STATUSES),
    }
    view: reactive[HeaderView | None] = reactive(None)

    def style_of(self, role: str) -> Style:
        return self.get_component_rich_style(f"header--{role}")

    def render(self) -> Text:
        v = self.view
        title: list[Piece] = [(" tuiwatch ", self.style_of("title"))]
        if v is None:
            return fitted(self.size.width, title)
        dim = self.style_of("dim")
        status, colour = status_text(v)
        alert: list[Piece] = []
        if v.alert is not None:
            more = f" (+{v.alerts - 1})" if v.alerts > 1 else ""
            step = "" if v.alert.step is None else f"@{v.alert.step}"
            alert = [("  ▲ ", ""), (f"{safe(v.alert.rule, 24)}{step}{more}", self.style_of(v.alert.severity))]
        # Drawn in this order; kept by rank where the terminal is narrow (dropped whole, never cut).
        return fitted(
            self.size.width,
            title,
            [(f" {safe(v.name, 40)}", self.style_of("name"))],
            [(f"@{safe(v.host, 30)}", dim)] if v.host else [],
            [(f"  {v.ranks}", self.style_of("name"))] if v.ranks else [],
            [(f"  step {'-' if v.step is None else f'{v.step:,}'}", "")],
            [(f"  epoch {'-' if v.epoch is None else v.epoch}", "")],
            [(f"  {duration(v.elapsed_s)}", "")],
            [("  ", ""), (f"● {status}", self.style_of(colour) if colour in STATUSES else "")],
            [(f"  [{v.mode}]", dim)] if v.mode != "live" else [],
            alert,
            rank=(0, 2, 9, 5, 3, 7, 6, 1, 8, 4),
        )
