"""Pane 1: loss (train and eval), learning rate (log) and pre-clip gradient norm (log) over steps."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from tuiwatch.analysis.format import number, safe
from tuiwatch.viewer.panes.base import Pane, chart_lines, window_label

TRAIN_STYLE = "bold cyan"
EVAL_STYLE = "bold magenta"


class TrainingPane(Pane):
    def __init__(self) -> None:
        super().__init__("training", id="training")

    def render(self) -> RenderableType:
        s = self.state
        width, height = self.content_region.width, self.content_region.height
        train, evaluation = s.train_metric(), s.eval_metric()
        step = s.last_step
        # Three charts share the height; each has a title line.
        chart_h = max(1, (height - 4) // 3)
        rows: list[Text] = []

        title = Text()
        if train is not None:
            title.append(f"{safe(train, 24)} ", style=TRAIN_STYLE)
            title.append(number(s.metrics[train].current))
        else:
            title.append("loss -", style="dim")
        if evaluation is not None:
            title.append(f"   {safe(evaluation, 24)} ", style=EVAL_STYLE)
            title.append(number(s.eval_metrics[evaluation].current))
        title.append(f"   {window_label(self.window)}", style="dim")
        rows.append(title)
        series = []
        if train is not None:
            series.append((s.metrics[train], TRAIN_STYLE))
        if evaluation is not None:
            series.append((s.eval_metrics[evaluation], EVAL_STYLE))
        rows += chart_lines(series, width, chart_h, self.window)

        lr = step.get("lr") if isinstance(step.get("lr"), list) else None
        rows.append(Text.assemble(("lr (log) ", "bold green"), number(lr[0] if lr else s.lr.current)))
        rows += chart_lines([(s.lr, "green")], width, chart_h, self.window, log=True)

        clipped = " clipped" if step.get("grad_norm_clipped") else ""
        rows.append(
            Text.assemble(("grad norm pre-clip (log) ", "bold yellow"), number(s.grad_norm.current), (clipped, "red"))
        )
        rows += chart_lines([(s.grad_norm, "yellow")], width, chart_h, self.window, log=True)

        others = [n for n in s.metrics if n != train][:6]
        if others and len(rows) < height:
            extra = Text()
            for name in others:
                extra.append(f"{safe(name, 20)} ", style="dim")
                extra.append(f"{number(s.metrics[name].current)}  ")
            rows.append(extra)
        return Group(*rows[:height])
