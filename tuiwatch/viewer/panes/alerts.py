"""Pane 4: alerts and command results, newest first, coloured by severity."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive

from tuiwatch.analysis.format import safe
from tuiwatch.viewer.panes.base import Pane
from tuiwatch.viewer.views import AlertsView

MAX_MESSAGE = 400


class AlertsPane(Pane):
    COMPONENT_CLASSES = {"pane--dim", "pane--critical", "pane--warning", "pane--info", "pane--rule"}
    view: reactive[AlertsView | None] = reactive(None)

    def __init__(self) -> None:
        super().__init__("alerts", id="alerts")

    def render(self) -> RenderableType:
        alerts = self.view.alerts if self.view is not None else ()
        dim = self.style_of("dim")
        if not alerts:
            return Text("no alerts", style=dim)
        rows: list[Text] = []
        # The newest alert is read whole (messages wrap); the pane clips what
        # does not fit below it.
        for alert in alerts[: self.content_region.height]:
            line = Text()
            severity = alert.severity if alert.severity in ("critical", "warning", "info") else None
            line.append(f"{alert.severity[:4]:<4}", style=self.style_of(severity) if severity else "")
            line.append(f" {'-' if alert.step is None else alert.step:>6} ", style=dim)
            if alert.rank is not None:
                line.append(f"r{alert.rank} ", style=self.style_of("rule"))
            message = alert.message
            if alert.rule and alert.rule != "command":
                line.append(f"{safe(alert.rule, 24)}: ", style=self.style_of("rule"))
                if message == f"{alert.rule} cleared":
                    message = "cleared"  # the rule's name is already on the line
            line.append(safe(message, MAX_MESSAGE))
            rows.append(line)
            if alert.next_check:
                rows.append(Text(f"  → {safe(alert.next_check, MAX_MESSAGE)}", style=dim))
            if alert.samples:
                rows.append(Text(f"  non-finite samples: {', '.join(map(str, alert.samples))}", style=dim))
            if alert.dump:
                # The path alone on its line, folded (never ellipsised) where it is longer than the pane:
                # what is selected is the whole path.
                rows.append(Text("  dump:", style=dim))
                rows.append(Text(safe(alert.dump, MAX_MESSAGE), style=dim, overflow="fold"))
        return Group(*rows)
