"""Pane 2: where a step's time goes — waiting for data or computing — and throughput."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive

from tuiwatch.analysis.format import number, seconds_short
from tuiwatch.viewer.panes.base import Pane, Piece, fitted
from tuiwatch.viewer.views import TimingView


class TimingPane(Pane):
    COMPONENT_CLASSES = {
        "pane--dim",
        "pane--wait",
        "pane--compute",
        "pane--wait-bar",
        "pane--compute-bar",
        "pane--wait-dominates",
    }
    view: reactive[TimingView | None] = reactive(None)

    def __init__(self) -> None:
        super().__init__("timing", id="timing")

    def render(self) -> RenderableType:
        v = self.view
        if v is None:
            return Text("")
        wait, compute = v.data_wait_s, v.compute_s
        width = self.content_region.width
        at: list[Piece] = [(f"@ {v.at_step:,} ", "reverse")] if v.at_step is not None else []  # the cursor's step
        rows = [
            fitted(
                width,
                at,
                [
                    ("wait ", self.style_of("wait")),
                    ("not measured" if wait is None and compute is not None else seconds_short(wait), ""),
                ],
                [("  compute ", self.style_of("compute")), (seconds_short(compute), "")],
            )
        ]
        if wait is not None and compute is not None and wait + compute > 0:
            share = wait / (wait + compute)
            bar_w = max(width - 12, 4)
            filled = round(share * bar_w)
            rows.append(
                fitted(
                    width,
                    [("█" * filled, self.style_of("wait-bar")), ("█" * (bar_w - filled), self.style_of("compute-bar"))],
                    [(f" {share:4.0%} wait", self.style_of("wait-dominates") if share > 0.5 else "")],
                )
            )
        rows.append(
            fitted(width, [(f"{number(v.examples_per_s, 3)} ex/s", "")], [(f"  step {seconds_short(v.step_s)}", "")])
        )
        rows += self.draw(v.chart, width, self.content_region.height - len(rows))
        return Group(*rows)
