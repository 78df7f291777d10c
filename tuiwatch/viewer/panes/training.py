"""Pane 1: loss (train and eval), learning rate (log) and pre-clip gradient norm (log) over steps."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.text import Text
from textual import events
from textual.reactive import reactive

from tuiwatch.analysis.format import number, safe
from tuiwatch.viewer.panes.base import Pane, Piece, fitted, step_at, window_label
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
        "pane--critical",
        "pane--compare",
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
        # Three charts share the height; each has a title line (and a step axis, drawn by the chart). An lr that
        # never changes is its title line alone: its rows go to the loss.
        chart_h = max(1, (height - 3) // 3)
        lr_h = 0 if v.lr_constant else chart_h
        loss_h = max(1, height - 3 - chart_h - lr_h)  # the loss chart takes the rows the division leaves
        if v.train_name is not None:
            train: list[Piece] = [
                (f"{safe(v.train_name, 24)} ", self.style_of("train")),
                (number(v.train_value), self.value_style(v.train_value)),
            ]
        else:
            train = [("loss -", dim)]
        if v.at_step is not None:
            train = [(f"@ step {v.at_step:,}  ", "reverse"), *train]  # the cursor's record: every value below is its
        evaluation: list[Piece] = []
        if v.eval_name is not None:
            evaluation = [
                (f"   {safe(v.eval_name, 24)} ", self.style_of("eval")),
                (number(v.eval_value), self.value_style(v.eval_value)),
            ]
        used = sum(cell_len(part) for part, _ in [*train, *evaluation])
        span = v.loss.span  # zoomed in: the steps shown, in place of the window
        label = (
            f"   {window_label(v.loss.window, v.step_unit)}" if span is None else f"   steps {span[0]:,}-{span[1]:,}"
        )
        if used + len(label) > width:
            # "last 1k": the window still shows
            label = f"  {window_label(v.loss.window, short=True)}" if span is None else f"  {span[0]}-{span[1]}"
        window = [(label, dim)]
        # e, y and o: said beside the window, left out first where the line is short.
        tags: list[Piece] = [
            (f"  ema {v.loss.smooth:g}" if v.loss.smooth else "", dim),
            ("  log" if v.loss.log else "", dim),
            ("  clip" if v.loss.clip else "", dim),
        ]
        # Narrow: a chosen window (not "all") is worth more than the eval value beside the train loss.
        rank = (0, 2, 1, 3) if v.loss.window is not None else (0, 1, 2, 3)
        compared: list[Piece] = [(f"   {safe(v.compared, 60)}", self.style_of("compare"))] if v.compared else []
        compared_rank = 4
        if compared and v.loss.mark is not None and used + cell_len(compared[0][0]) > width:
            # Narrow: where the runs part (the dotted line's step) comes before the eval value and the window.
            compared = [(f"  ┊ parts at {v.loss.mark:,}", self.style_of("compare"))]
            compared_rank = 0
        line = fitted(width, train, evaluation, window, tags, compared, rank=(*rank, compared_rank))
        rows = [line, *self.draw(v.loss, width, loss_h)]
        lr_value = [(number(v.lr_value), self.value_style(v.lr_value))]
        constant = [(" constant", self.style_of("dim"))] if v.lr_constant else []
        rows.append(fitted(width, [("lr (log) ", self.style_of("lr-title")), *lr_value], constant))
        rows += self.draw(v.lr, width, lr_h)
        norm = [(number(v.grad_norm_value), self.value_style(v.grad_norm_value))]
        clipped = [(" clipped", self.style_of("clipped"))] if v.grad_norm_clipped else []
        if v.combined:  # FSDP with every rank here: the model's, the root of the sum of the shards' squares
            label = "grad norm, ranks' shards combined (log) " if width >= 48 else "grad norm "
        elif v.sharded:  # FSDP: this rank's shard of the gradients, measured at its optimizer step
            label = "grad norm of this rank's shard (log) " if width >= 48 else "shard grad norm "
        else:
            label = "grad norm pre-clip (log) " if width >= 36 else "grad norm "
        rows.append(fitted(width, [(label, self.style_of("grad-title")), *norm], clipped))
        rows += self.draw(v.grad_norm, width, chart_h)
        if v.others and len(rows) < height:
            others: list[list[Piece]] = [
                [(f"{safe(name, 20)} ", dim), (f"{number(value)}  ", "")] for name, value in v.others
            ]
            rows.append(fitted(width, *others))
        return Group(*rows[:height])

    def on_click(self, event: events.Click) -> None:
        """A click on a chart puts the cursor at the step under it (the loss chart's steps: the three share them)."""
        at = event.get_content_offset(self)
        v = self.view
        if at is None or v is None:
            return
        step = step_at(v.loss, self.content_region.width, at.x)
        if step is not None:
            self.post_message(self.StepClicked(step))
