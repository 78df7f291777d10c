"""The header line: run name, host, step, epoch, elapsed, status."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tuiwatch.analysis.format import duration, safe
from tuiwatch.viewer.views import HeaderView

STATUSES = ("live", "paused", "degraded", "connecting", "disconnected", "finished", "stopped")


class HeaderBar(Widget):
    COMPONENT_CLASSES = {"header--title", "header--name", "header--dim", *(f"header--{s}" for s in STATUSES)}
    view: reactive[HeaderView | None] = reactive(None)

    def render(self) -> Text:
        v = self.view
        text = Text()
        text.append(" tuiwatch ", style=self.get_component_rich_style("header--title"))
        if v is None:
            return text
        dim = self.get_component_rich_style("header--dim")
        text.append(f" {safe(v.name, 40)}", style=self.get_component_rich_style("header--name"))
        if v.host:
            text.append(f"@{safe(v.host, 30)}", style=dim)
        text.append(f"  step {'-' if v.step is None else f'{v.step:,}'}")
        text.append(f"  epoch {'-' if v.epoch is None else v.epoch}")
        text.append(f"  {duration(v.elapsed_s)}")
        text.append("  ")
        status = self.get_component_rich_style(f"header--{v.status}") if v.status in STATUSES else ""
        text.append(f"● {v.status}", style=status)
        if v.mode != "live":
            text.append(f"  [{v.mode}]", style=dim)
        return text
