"""Pane 1: loss (train and eval), learning rate (log) and pre-clip gradient norm (log) over steps."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive

from tuiwatch.analysis.format import number, safe
from tuiwatch.viewer.panes.base import Pane, window_label
from tuiwatch.viewer.views import TrainingView


class TrainingPane(Pane):
    COMPONENT_CLASSES = {
        "pane--dim",
        "pane--train",
        "pane--eval",
        "pane--lr",
        "pane--lr-title",
        "pane--grad",
        "pane--grad-title",
        "pane--clipped",
    }
    view: reactive[TrainingView | None] = reactive(None)

    def __init__(self) -> None:
        super().__init__("training", id="training")

    def render(self) -> RenderableType:
        v = self.view
        if v is None:
            return Text("")
        dim = self.style_of("dim")
        width, height = self.content_region.width, self.content_region.height
        # Three charts share the height; each has a title line.
        chart_h = max(1, (height - 4) // 3)
        title = Text()
        if v.train_name is not None:
            title.append(f"{safe(v.train_name, 24)} ", style=self.style_of("train"))
            title.append(number(v.train_value))
        else:
            title.append("loss -", style=dim)
        if v.eval_name is not None:
            title.append(f"   {safe(v.eval_name, 24)} ", style=self.style_of("eval"))
            title.append(number(v.eval_value))
        title.append(f"   {window_label(v.loss.window, v.step_unit)}", style=dim)
        rows = [title, *self.draw(v.loss, width, chart_h)]
        rows.append(Text.assemble(("lr (log) ", self.style_of("lr-title")), number(v.lr_value)))
        rows += self.draw(v.lr, width, chart_h)
        rows.append(
            Text.assemble(
                ("grad norm pre-clip (log) ", self.style_of("grad-title")),
                number(v.grad_norm_value),
                (" clipped" if v.grad_norm_clipped else "", self.style_of("clipped")),
            )
        )
        rows += self.draw(v.grad_norm, width, chart_h)
        if v.others and len(rows) < height:
            extra = Text()
            for name, value in v.others:
                extra.append(f"{safe(name, 20)} ", style=dim)
                extra.append(f"{number(value)}  ")
            rows.append(extra)
        return Group(*rows[:height])
