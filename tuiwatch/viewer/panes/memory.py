"""Pane 3: device memory against its total, GPUs from NVML, and the process's CPU side."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from rich.console import Group, RenderableType
from rich.text import Text

from tuiwatch.analysis.format import safe, size
from tuiwatch.viewer.panes.base import Pane, chart_lines
from tuiwatch.viewer.state import is_number

_LABEL = 10  # "allocated " and "reserved  "
_SIZE = 10  # " 123.4 GiB"
_BARS = (("allocated", "mem_allocated"), ("reserved", "mem_reserved"), ("peak", "mem_peak"))


def _is_number(value: Any) -> TypeGuard[int | float]:
    """A finite number: anything else from a run (NaN, a string, a list) is shown as "-"."""
    return is_number(value) and math.isfinite(value)


def _bar(label: str, used: float, total: float, width: int) -> Text:
    share = min(max(used / total, 0.0), 1.0)
    # In a narrow pane the bar keeps its cells and the byte count goes.
    with_size = width - _LABEL - 5 - _SIZE >= 8
    cells = max(width - _LABEL - 5 - (_SIZE if with_size else 0), 4)
    filled = round(share * cells)
    style = "red" if share > 0.9 else "yellow" if share > 0.75 else "green"
    return Text.assemble(
        f"{label:<{_LABEL}}",
        ("█" * filled, style),
        ("░" * (cells - filled), "dim"),
        f" {share:4.0%}",
        f" {_size(used):>{_SIZE - 1}}" if with_size else "",
        no_wrap=True,
        overflow="ellipsis",
    )


def _used_of(used: Any, total: Any) -> str:
    """``31.4/80.0 GiB``: both in the total's unit."""
    if not (_is_number(used) and _is_number(total)) or total <= 0:
        return f"{_size(used)}/{_size(total)}"
    value, unit = size(total).split(" ")
    return f"{used * float(value) / total:.1f}/{value} {unit}"


def device_total(run: Mapping[str, Any], gpus: list[dict[str, Any]] | None) -> float | None:
    """The run's device memory: from the run record, else NVML's reading of that device."""
    total = run.get("mem_total")
    if _is_number(total) and total > 0:
        return float(total)
    device = run.get("device")
    if not gpus or not isinstance(device, str) or not device.startswith("cuda"):
        return None
    device = device if ":" in device else "cuda:0"
    reading = next((g.get("mem_total") for g in gpus if g.get("device") == device), None)
    return float(reading) if _is_number(reading) and reading > 0 else None


def _gpu_line(gpu: dict[str, Any]) -> Text:
    mine = gpu.get("process_mem_used")
    return Text(
        f"gpu{safe(gpu.get('index'), 4)} {_pct(gpu.get('util'))}  "
        f"mem {_used_of(gpu.get('mem_used'), gpu.get('mem_total'))}"
        + (f" (run {_size(mine)})" if _is_number(mine) else "")
        + f"  {_unit(gpu.get('temp'), '°C')}  {_unit(gpu.get('power'), 'W')}",
        no_wrap=True,
        overflow="ellipsis",
    )


def _cpu_line(system: Mapping[str, Any]) -> Text:
    workers = system.get("workers")
    worker_cpu = system.get("workers_cpu_percent")
    busy = sum(v for v in worker_cpu if _is_number(v)) if isinstance(worker_cpu, list) else None
    return Text(
        f"cpu {_pct(system.get('cpu_percent'))}  rss {_size(system.get('rss'))}  "
        f"workers {workers if isinstance(workers, int) else '-'}"
        + (f" ({busy:.0f}% cpu)" if workers and busy is not None else ""),
        no_wrap=True,
        overflow="ellipsis",
    )


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
        if _is_number(allocated):
            total = device_total(s.run, gpus)
            if total is None:
                rows.append(
                    Text(f"alloc {_size(allocated)}  reserved {_size(step.get('mem_reserved'))}  "
                         f"peak {_size(step.get('mem_peak'))}", no_wrap=True, overflow="ellipsis")
                )  # fmt: skip
            else:
                for label, field in (
                    ("allocated", "mem_allocated"),
                    ("reserved", "mem_reserved"),
                    ("peak", "mem_peak"),
                ):
                    value = step.get(field)
                    if _is_number(value):
                        rows.append(_bar(label, float(value), total, width))
                rows.append(Text(f"of {_size(total)} on {safe(s.run.get('device'), 20)}", style="dim"))
        rows += [_gpu_line(gpu) for gpu in gpus or []]
        if not gpus:
            reason = system.get("gpu_error")
            rows.append(
                Text(f"no GPU: {safe(reason, 120)}" if reason else "no GPU readings", style="dim", no_wrap=True,
                     overflow="ellipsis")
            )  # fmt: skip
        rows.append(_cpu_line(system))
        chart_h = self.content_region.height - len(rows)
        if chart_h > 0:
            series = s.mem_allocated if s.mem_allocated.count else s.rss
            label = "allocated" if s.mem_allocated.count else "rss"
            rows.append(Text(f"{label} over steps", style="dim"))
            rows += chart_lines([(series, "green")], width, chart_h - 1, self.window)
        return Group(*rows)


def _size(value: Any) -> str:
    return size(value) if _is_number(value) else "-"


def _pct(value: Any) -> str:
    return f"{value:.0f}%" if _is_number(value) else "-"


def _unit(value: Any, unit: str) -> str:
    return f"{value:.0f}{unit}" if _is_number(value) else f"-{unit}"
