"""The ranks pane of a multi-rank job: per rank its status, step, data wait, backward (with the wait at the
gradient sync), step time, memory and host; the rank the others wait for is marked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive

from tuiwatch.analysis.format import safe, size
from tuiwatch.viewer.panes.base import Pane
from tuiwatch.viewer.views import RANK_ROLES, RankRow, RanksView
from tuiwatch.wire.job_relay import MAX_STEPS_PER_S

CHART_ROWS = 6  # a per-rank chart: 5 rows of dots and the step axis


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}ms"


@dataclass(frozen=True)
class Column:
    title: str
    width: int
    cell: Callable[[RankRow], str]


# In the order they are dropped last to first when the pane is narrow: a column is shown whole or not at all.
COLUMNS = (
    Column("rank", 5, lambda r: ("»" if r.waited_for else " ") + str(r.rank)),
    Column("status", 9, lambda r: r.status),
    Column("step", 7, lambda r: "-" if r.step is None else str(r.step)),
    # What tells the culprit from its victims first; the step time (equal on every rank under DDP) after.
    Column("wait", 8, lambda r: _ms(r.data_wait_s)),
    Column("bwd+sync", 9, lambda r: _ms(r.backward_s)),
    Column("time", 8, lambda r: _ms(r.step_s)),
    Column("mem", 10, lambda r: "-" if r.memory is None else size(r.memory)),
    Column("host", 12, lambda r: safe(r.host or "-", 11)),
)
STATUS_ROLE = {"stale": "warning", "gone": "critical", "failed": "critical", "paused": "warning"}


def columns_for(width: int) -> tuple[Column, ...]:
    shown, used = [], 0
    for column in COLUMNS:
        if used + column.width > width:
            break
        shown.append(column)
        used += column.width
    return tuple(shown)


class RanksPane(Pane):
    COMPONENT_CLASSES = {
        "pane--dim",
        "pane--critical",
        "pane--warning",
        "pane--rule",
        *(f"pane--{r}" for r in RANK_ROLES),
    }
    view: reactive[RanksView | None] = reactive(None)

    def __init__(self) -> None:
        super().__init__("ranks", id="ranks")

    def render(self) -> RenderableType:
        v = self.view
        if v is None:
            return Text("")
        columns = columns_for(self.content_region.width)
        dim = self.style_of("dim")
        lines = [Text("".join(f"{c.title:<{c.width}}" for c in columns), style=dim, no_wrap=True)]
        if v.summary is not None:
            lines.append(Text(safe(v.summary, 300), no_wrap=True, overflow="ellipsis"))
        for row in v.rows:
            line = Text(no_wrap=True, overflow="crop")
            for column in columns:
                cell = f"{column.cell(row):<{column.width}}"[: column.width]
                role = STATUS_ROLE.get(row.status) if column.title == "status" else None
                if column.title == "rank" and row.waited_for:
                    role = "warning"
                if column.title == "time" and row.slowest:
                    role = "rule"
                line.append(cell, style=self.style_of(role) if role else "")
            lines.append(line)
        if any(r.waited_for for r in v.rows):
            lines.append(Text("» the others wait for it (straggler)", style=dim, no_wrap=True))
        thinned = [r for r in v.rows if r.thinned]
        if thinned:
            which = ", ".join(f"{r.rank} ({r.thinned:,})" for r in thinned)
            said = f"steps left out by the relay (over {MAX_STEPS_PER_S}/s): rank {which}"
            lines.append(Text(said, style=dim, no_wrap=True, overflow="ellipsis"))
        # Below the table, what differs between ranks over steps, as far as the pane has room.
        room = self.content_region.height - len(lines)
        for title, chart in (("data wait", v.wait), ("memory", v.memory)):
            if chart is None or room < CHART_ROWS + 1:
                break
            legend = Text(f"{title} by rank ", style=dim, no_wrap=True, overflow="crop")
            for rank, role in zip(v.charted, RANK_ROLES[: len(v.charted)], strict=True):
                legend.append(f"■{rank} ", style=self.style_of(role))
            lines.append(legend)
            lines += self.draw(chart, self.content_region.width, CHART_ROWS)
            room -= CHART_ROWS + 1
        return Group(*lines)
