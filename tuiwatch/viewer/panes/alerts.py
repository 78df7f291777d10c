"""Pane 4: alerts and command results, newest first, coloured by severity; a history to move through.

Focused (``tab``), the pane takes ``↑``/``↓`` (or ``k``/``j``) to select an
alert, scrolling to keep it in sight, ``1``/``2``/``3`` to show criticals,
then warnings, then everything, and ``enter`` to open the selected alert whole
(it posts :class:`AlertsPane.Chosen`; the app opens the screen).
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive

from tuiwatch.analysis.format import safe
from tuiwatch.viewer.panes.base import Pane
from tuiwatch.viewer.state import Alert
from tuiwatch.viewer.views import AlertRow, AlertsView, alert_rows, shown_at

MAX_MESSAGE = 400
SEVERITIES = ("critical", "warning", "info")  # each has its colour
LEVEL_NAMES = {1: "critical", 2: "warnings and up", 3: "all"}


class AlertsPane(Pane):
    COMPONENT_CLASSES = {"pane--dim", "pane--critical", "pane--warning", "pane--info", "pane--rule"}
    BINDINGS = [
        Binding("up,k", "move(-1)", "previous alert", show=False),
        Binding("down,j", "move(1)", "next alert", show=False),
        Binding("1", "level(1)", "critical only", show=False),
        Binding("2", "level(2)", "warnings and up", show=False),
        Binding("3", "level(3)", "all", show=False),
        Binding("enter", "choose", "open the alert", show=False),
    ]
    view: reactive[AlertsView | None] = reactive(None)
    level: reactive[int] = reactive(3)
    selected: reactive[Alert | None] = reactive(None)  # the alert, not its index: new ones come on top

    class Chosen(Message):
        """``enter`` on an alert: the app shows it whole."""

        def __init__(self, row: AlertRow) -> None:
            super().__init__()
            self.row = row

    def __init__(self) -> None:
        super().__init__("alerts", id="alerts")
        self._top = 0  # the first row drawn: the pane scrolls to keep the selected one in sight

    def rows(self) -> tuple[AlertRow, ...]:
        return alert_rows(self.view.alerts if self.view is not None else (), self.level)

    def _index(self, rows: tuple[AlertRow, ...]) -> int | None:
        return next((i for i, r in enumerate(rows) if r.alert == self.selected), None)

    def action_move(self, delta: int) -> None:
        rows = self.rows()
        if not rows:
            return
        at = self._index(rows)
        at = 0 if at is None else min(max(at + delta, 0), len(rows) - 1)
        self.selected = rows[at].alert

    def action_level(self, level: int) -> None:
        self.level = level
        self._top = 0
        if self._index(self.rows()) is None:
            self.selected = None  # filtered out: the selection starts again from the top

    def action_choose(self) -> None:
        rows = self.rows()
        at = self._index(rows)
        if at is None and rows:
            at = 0  # nothing selected yet: the newest
        if at is not None:
            self.post_message(self.Chosen(rows[at]))

    def render(self) -> RenderableType:
        rows = self.rows()
        dim = self.style_of("dim")
        hidden = sum(1 for a in (self.view.alerts if self.view is not None else ()) if not shown_at(a, self.level))
        if not rows:
            said = "no alerts" if hidden <= 0 else f"no {LEVEL_NAMES[self.level]} alerts ({hidden} others: 3 shows all)"
            return Text(said, style=dim)
        height = max(self.content_region.height, 1)
        blocks = [self._block(row, focused=self.has_focus and row.alert == self.selected, dim=dim) for row in rows]
        at = self._index(rows)
        if at is None:
            self._top = 0
        else:
            # Scroll as little as needed for the selected row to be drawn whole (its first line at least).
            self._top = min(self._top, at)
            while self._top < at and sum(len(b) for b in blocks[self._top : at + 1]) > height:
                self._top += 1
        lines: list[Text] = []
        if self.level != 3:
            lines.append(Text(f"{LEVEL_NAMES[self.level]} ({hidden} hidden: 3 shows all)", style=dim))
        if self._top:
            lines.append(Text(f"↑ {self._top} newer", style=dim))
        for block in blocks[self._top :]:
            lines += block
        return Group(*lines)

    def _block(self, row: AlertRow, focused: bool, dim: Style) -> list[Text]:
        """An alert's lines: the alert, its next check, its non-finite samples, its dump (the newest alert is
        read whole: messages wrap; the pane clips what does not fit below)."""
        alert = row.alert
        line = Text()
        severity = alert.severity if alert.severity in SEVERITIES else None
        line.append(f"{alert.severity[:4]:<4}", style=self.style_of(severity) if severity else "")
        line.append(f" {'-' if alert.step is None else alert.step:>6} ", style=dim)
        if alert.rank is not None:
            line.append(f"r{alert.rank} ", style=self.style_of("rule"))
        message = alert.message
        if alert.rule and alert.rule != "command":
            line.append(f"{safe(alert.rule, 24)}: ", style=self.style_of("rule"))
            if message == f"{alert.rule} cleared":
                message = "cleared"  # the rule's name is already on the line
        if row.count > 1:
            steps = [s for s in row.steps if s is not None]
            span = f", steps {min(steps)}-{max(steps)}" if steps else ""
            line.append(f"×{row.count}{span}: ", style=self.style_of("rule"))
        line.append(safe(message, MAX_MESSAGE))
        if focused:
            line.stylize("reverse")
        lines = [line]
        if alert.next_check:
            lines.append(Text(f"  → {safe(alert.next_check, MAX_MESSAGE)}", style=dim))
        if alert.samples:
            lines.append(Text(f"  non-finite samples: {', '.join(map(str, alert.samples))}", style=dim))
        if alert.dump:
            # The path alone on its line, folded (never ellipsised) where it is longer than the pane:
            # what is selected is the whole path.
            lines.append(Text("  dump:", style=dim))
            lines.append(Text(safe(alert.dump, MAX_MESSAGE), style=dim, overflow="fold"))
        return lines
