"""Pane 2: where a step's time goes — waiting for data or computing — and throughput."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tuiwatch.analysis.format import number, seconds_short
from tuiwatch.viewer.panes.base import Pane, chart_lines

WAIT_STYLE = "bold red"
COMPUTE_STYLE = "bold blue"


class TimingPane(Pane):
    def __init__(self) -> None:
        super().__init__("timing", id="timing")

    def render(self) -> RenderableType:
        s = self.state
        step = s.last_step
        wait, compute = step.get("data_wait_s"), step.get("compute_s")
        rows = [
            Text.assemble(
                ("wait ", WAIT_STYLE), seconds_short(wait), ("  compute ", COMPUTE_STYLE), seconds_short(compute),
                no_wrap=True,
            )
        ]  # fmt: skip
        if isinstance(wait, int | float) and isinstance(compute, int | float) and wait + compute > 0:
            share = wait / (wait + compute)
            bar_w = max(self.content_region.width - 15, 4)
            filled = round(share * bar_w)
            style = "bold red" if share > 0.5 else ""
            rows.append(
                Text.assemble(("█" * filled, "red"), ("█" * (bar_w - filled), "blue"), (f" {share:5.1%} wait", style))
            )
        rows.append(
            Text(f"{number(step.get('examples_per_s'), 3)} ex/s  step {seconds_short(_total(step))}", no_wrap=True)
        )
        chart_h = self.content_region.height - len(rows)
        rows += chart_lines(
            [(s.compute, COMPUTE_STYLE), (s.data_wait, WAIT_STYLE)], self.content_region.width, chart_h, self.window
        )
        return Group(*rows)


def _total(step: Mapping[str, Any]) -> float | None:
    wait, compute = step.get("data_wait_s"), step.get("compute_s")
    if isinstance(wait, int | float) and isinstance(compute, int | float):
        return wait + compute
    return None
