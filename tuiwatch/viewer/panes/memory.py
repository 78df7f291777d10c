"""Pane 3: device memory against its total, GPUs from NVML, and the process's CPU side."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tuiwatch.viewer.panes.base import Pane, chart_lines
from tuiwatch.viewer.render.text import safe, size


def _bar(used: float, total: float, width: int) -> Text:
    share = min(max(used / total, 0.0), 1.0) if total else 0.0
    filled = round(share * width)
    style = "red" if share > 0.9 else "yellow" if share > 0.75 else "green"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"), f" {share:4.0%}")


class MemoryPane(Pane):
    def __init__(self) -> None:
        super().__init__("memory & devices", id="memory")

    def render(self) -> RenderableType:
        s = self.state
        step, system = s.last_step, s.last_system
        width = self.content_region.width
        rows: list[Text] = []
        gpus: list[dict[str, Any]] | None = system.get("gpus") if isinstance(system.get("gpus"), list) else None
        allocated = step.get("mem_allocated")
        if isinstance(allocated, int | float):
            total = gpus[0].get("mem_total") if gpus else None
            rows.append(
                Text(
                    f"alloc {size(allocated)}  reserved {size(step.get('mem_reserved'))}  "
                    f"peak {size(step.get('mem_peak'))}"
                )
            )
            if isinstance(total, int | float) and total > 0:
                rows.append(_bar(float(allocated), float(total), max(width - 6, 4)))
        for gpu in gpus or []:
            rows.append(
                Text(
                    f"gpu{gpu.get('index')} util {_pct(gpu.get('util'))}  mem {size(gpu.get('mem_used'))}"
                    f"/{size(gpu.get('mem_total'))}  {_unit(gpu.get('temp'), '°C')}  {_unit(gpu.get('power'), 'W')}"
                )
            )
        if not gpus:
            reason = system.get("gpu_error")
            rows.append(
                Text(f"no GPU: {safe(reason, 120)}" if reason else "no GPU readings", style="dim", no_wrap=True,
                     overflow="ellipsis")
            )  # fmt: skip
        workers = system.get("workers")
        rows.append(
            Text(
                f"cpu {_pct(system.get('cpu_percent'))}  rss {size(system.get('rss'))}  "
                f"workers {workers if isinstance(workers, int) else '-'}"
            )
        )
        chart_h = self.content_region.height - len(rows)
        if chart_h > 0:
            series = s.mem_allocated if s.mem_allocated.count else s.rss
            label = "allocated" if s.mem_allocated.count else "rss"
            rows.append(Text(f"{label} over steps", style="dim"))
            rows += chart_lines([(series, "green")], width, chart_h - 1, self.window)
        return Group(*rows)


def _pct(value: Any) -> str:
    return f"{value:.0f}%" if isinstance(value, int | float) else "-"


def _unit(value: Any, unit: str) -> str:
    return f"{value:.0f}{unit}" if isinstance(value, int | float) else f"-{unit}"
