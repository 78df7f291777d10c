"""Pane 4: alerts and command results, newest first, coloured by severity."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from tuiwatch.viewer.panes.base import Pane
from tuiwatch.viewer.render.text import safe

SEVERITY_STYLE = {"critical": "bold white on red", "warning": "bold yellow", "info": "cyan"}


class AlertsPane(Pane):
    def __init__(self) -> None:
        super().__init__("alerts", id="alerts")

    def render(self) -> RenderableType:
        width, height = self.content_region.width, self.content_region.height
        alerts = list(self.state.alerts)
        if not alerts:
            return Text("no alerts", style="dim")
        rows: list[Text] = []
        for alert in alerts:
            if len(rows) >= height:
                break
            line = Text()
            line.append(f"{alert.severity[:4]:<4}", style=SEVERITY_STYLE.get(alert.severity, ""))
            line.append(f" {'-' if alert.step is None else alert.step:>6} ", style="dim")
            if alert.rule and alert.rule != "command":
                line.append(f"{safe(alert.rule, 24)}: ", style="bold")
            line.append(safe(alert.message, max(width * 2, 40)))
            line.truncate(width, overflow="ellipsis")
            rows.append(line)
            if alert.next_check and len(rows) < height:
                rows.append(Text(f"{'':11}→ {safe(alert.next_check, width)}", style="dim", overflow="ellipsis"))
        return Group(*rows)
