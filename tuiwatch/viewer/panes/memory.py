"""Pane 3: device memory against its total, GPUs from NVML, and the process's CPU side."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.style import Style
from rich.text import Text
from textual.reactive import reactive

from tuiwatch.analysis.format import percent, safe, size, size_of, with_unit
from tuiwatch.viewer.panes.base import Pane, fitted
from tuiwatch.viewer.views import GpuView, MemoryView

LABEL = 10  # "allocated " and "reserved  "
SIZE = 10  # " 123.4 GiB"


def share_style(share: float) -> str:
    """The bar's colour role: full, filling, or fine."""
    return "full" if share > 0.9 else "filling" if share > 0.75 else "fine"


def bar(label: str, used: float, total: float, width: int, styles: dict[str, Style] | None = None) -> Text:
    """``allocated ████░░░░  42%  33.6 GiB``: a share of the device total in ``width`` cells."""
    styles = styles or {}
    share = min(max(used / total, 0.0), 1.0)
    # In a narrow pane the bar keeps its cells and the byte count goes.
    with_size = width - LABEL - 5 - SIZE >= 8
    cells = max(width - LABEL - 5 - (SIZE if with_size else 0), 4)
    filled = round(share * cells)
    return Text.assemble(
        f"{label:<{LABEL}}",
        ("█" * filled, styles.get(share_style(share), "")),
        ("░" * (cells - filled), styles.get("dim", "")),
        f" {share:4.0%}",
        f" {size(used):>{SIZE - 1}}" if with_size else "",
        no_wrap=True,
        overflow="ellipsis",
    )


def gpu_line(gpu: GpuView, width: int) -> Text:
    """One GPU in whole pieces: a narrow pane drops the watts, then the temperature, never half a number."""
    run = f" (run {size(gpu.run_mem_used)})" if gpu.run_mem_used is not None else ""
    return fitted(
        width,
        [(f"gpu{safe(gpu.index, 4)} {percent(gpu.util_percent)}", "")],
        [(f"  mem {size_of(gpu.mem_used, gpu.mem_total)}", "")],
        [(run, "")],
        [(f"  {with_unit(gpu.temp_c, '°C')}", "")],
        [(f"  {with_unit(gpu.power_w, 'W')}", "")],
    )


def cpu_line(v: MemoryView, width: int) -> Text:
    """CPU, RSS and the loader workers in whole pieces: ``rss 305.9 …`` would be another number."""
    busy = f" ({v.workers_cpu_percent:.0f}% cpu)" if v.workers_cpu_percent is not None else ""
    return fitted(
        width,
        [(f"cpu {percent(v.cpu_percent)}", "")],
        [(f"  rss {size(v.rss)}", "")],
        [(f"  workers {'-' if v.workers is None else v.workers}{busy}", "")],
    )


class MemoryPane(Pane):
    COMPONENT_CLASSES = {"pane--dim", "pane--fine", "pane--filling", "pane--full", "pane--memory"}
    view: reactive[MemoryView | None] = reactive(None)

    def __init__(self) -> None:
        super().__init__("memory & devices", id="memory")

    def render(self) -> RenderableType:
        v = self.view
        if v is None:
            return Text("")
        dim = self.style_of("dim")
        width = self.content_region.width
        rows: list[Text] = []
        if v.at_step is not None:  # the cursor's step: what was kept of it (docs/viewer.md)
            rows.append(Text(f"@ step {v.at_step:,}", style="reverse", no_wrap=True))
        d = v.device
        if d is not None and d.total is None:
            rows.append(
                Text(
                    f"alloc {size(d.allocated)}  reserved {size(d.reserved)}  peak {size(d.peak)}",
                    no_wrap=True,
                    overflow="ellipsis",
                )
            )
        elif d is not None and d.total is not None:
            styles = {role: self.style_of(role) for role in ("dim", "fine", "filling", "full")}
            for label, value in (("allocated", d.allocated), ("reserved", d.reserved), ("peak", d.peak)):
                if value is not None:
                    rows.append(bar(label, value, d.total, width, styles))
            rows.append(Text(f"of {size(d.total)} on {safe(d.device, 20)}", style=dim))
        rows += [gpu_line(gpu, width) for gpu in v.gpus]
        if not v.gpus:
            text = f"no GPU: {safe(v.gpu_error, 120)}" if v.gpu_error else "no GPU readings"
            rows.append(Text(text, style=dim, no_wrap=True, overflow="ellipsis"))
        rows.append(cpu_line(v, width))
        chart_h = self.content_region.height - len(rows)
        if chart_h > 0:
            rows.append(Text(f"{v.chart_label} over steps", style=dim))
            rows += self.draw(v.chart, width, chart_h - 1)
        return Group(*rows)
