"""The ranks pane of a multi-rank job: per rank its status, step, data wait, backward (with the wait at the
gradient sync), step time, memory and host; the rank the others wait for is marked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

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


def _short_ms(value: float | None) -> str:
    """At most 5 characters: 4.0ms, 21ms, 1.2s."""
    if value is None:
        return "-"
    ms = value * 1000
    return f"{ms:.1f}ms" if ms < 9.95 else f"{ms:.0f}ms" if ms < 999.5 else f"{value:.1f}s"


def _rank(row: RankRow) -> str:
    return ("»" if row.waited_for else " ") + str(row.rank)


def _step(row: RankRow) -> str:
    return "-" if row.step is None else str(row.step)


@dataclass(frozen=True)
class Column:
    title: str
    width: int  # the cell and the gap after it
    cell: Callable[[RankRow], str]


# Every column, when the pane is wide enough for all of them.
COLUMNS = (
    Column("rank", 5, _rank),
    Column("status", 9, lambda r: r.status),
    Column("step", 7, _step),
    # What tells the culprit from its victims first; the step time (equal on every rank under DDP) after.
    Column("wait", 8, lambda r: _ms(r.data_wait_s)),
    Column("bwd+sync", 9, lambda r: _ms(r.backward_s)),
    Column("time", 8, lambda r: _ms(r.step_s)),
    Column("mem", 10, lambda r: "-" if r.memory is None else size(r.memory)),
    Column("host", 12, lambda r: safe(r.host or "-", 11)),
)
SHORT_STATUS = {"finished": "done", "stopped": "stop", "failed": "fail", "paused": "pause", "connecting": "conn"}
# A narrower pane (a side column of a 60- to 160-column terminal): short cells, and the columns that name the
# straggler and why first, each kept whole or left out from the right. "sync" is bwd+sync.
NARROW = (
    Column("#", 3, _rank),
    Column("state", 6, lambda r: SHORT_STATUS.get(r.status, r.status)),
    Column("wait", 6, lambda r: _short_ms(r.data_wait_s)),
    Column("sync", 6, lambda r: _short_ms(r.backward_s)),
    Column("step", 7, _step),
    Column("time", 6, lambda r: _short_ms(r.step_s)),
    Column("mem", 10, lambda r: "-" if r.memory is None else size(r.memory)),
    Column("host", 12, lambda r: safe(r.host or "-", 11)),
)
STATUS_ROLE = {"stale": "warning", "gone": "critical", "failed": "critical", "paused": "warning"}


def columns_for(width: int, rank_digits: int = 1) -> tuple[Column, ...]:
    """The columns a pane ``width`` characters wide shows (the last one needs no gap after it)."""
    if sum(c.width for c in COLUMNS) - 1 <= width:
        return COLUMNS
    narrow = (replace(NARROW[0], width=max(NARROW[0].width, rank_digits + 2)), *NARROW[1:])
    shown, used = [], 0
    for column in narrow:
        if used + column.width - 1 > width:
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
        digits = max((len(str(r.rank)) for r in v.rows), default=1)
        columns = columns_for(self.content_region.width, digits)
        dim = self.style_of("dim")
        lines = [Text("".join(f"{c.title:<{c.width}}" for c in columns), style=dim, no_wrap=True)]
        if v.summary is not None:
            lines.append(Text(safe(v.summary, 300), no_wrap=True, overflow="ellipsis"))
        for row in v.rows:
            line = Text(no_wrap=True, overflow="crop")
            for column in columns:
                cell = f"{column.cell(row):<{column.width}}"[: column.width]
                role = STATUS_ROLE.get(row.status) if column.title in ("status", "state") else None
                if column.cell is _rank and row.waited_for:
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
