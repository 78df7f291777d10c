"""What ``i`` shows: the run record (how the run was started and watched) and its latest system record, as lines.

Pure: records in, ``(label, value)`` pairs out, every value made safe for the
terminal here (a run record comes from the run, which may be anyone's code).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from tuiwatch.analysis.format import rules_text, safe, size, size_of
from tuiwatch.ledger.fields import integer, num

VALUE_CHARS = 300  # a value longer than this (an argv of a hundred flags) is cut, and says so


def run_info(run: Mapping[str, Any], system: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The run's lines, then the machine's: a missing field is left out, never shown as a made-up value."""
    lines: list[tuple[str, str]] = []

    def add(label: str, value: Any) -> None:
        if value is not None and value != "":
            lines.append((label, safe(str(value), VALUE_CHARS)))

    add("name", run.get("name"))
    add("run id", run.get("run_id"))
    world = integer(run.get("world_size"))
    if world is not None and world > 1:
        add("rank", f"{run.get('rank')} of {world} (local rank {run.get('local_rank', run.get('rank'))})")
    add("host", _joined(run.get("host"), f"pid {run.get('pid')}" if run.get("pid") is not None else None))
    add("started", run.get("started"))
    argv = run.get("argv")
    if isinstance(argv, list):
        add("command", shlex.join(str(a) for a in argv))
    add("seed", run.get("seed"))
    params = integer(run.get("params"))
    add("model", _joined(run.get("model"), f"{params:,} parameters" if params is not None else None))
    add("optimizer", run.get("optimizer"))
    add("device", _joined(run.get("device"), _memory(run.get("mem_total"))))
    add("versions", _versions(run))
    add("watch", _settings(run))
    add("rules", rules_text(run.get("rules"), run.get("rules_note")))
    resumed = run.get("resumed_from")
    if isinstance(resumed, Mapping):
        add("resumed from", _joined(resumed.get("checkpoint"), f"step {resumed.get('step')}"))
    integration = run.get("integration")
    if isinstance(integration, Mapping):
        add("integration", integration.get("by"))
        unseen = integration.get("not_seen")
        if isinstance(unseen, list) and unseen:
            add("not seen", "; ".join(str(u) for u in unseen))
    add("run dir", run.get("run_dir"))
    add("socket", run.get("socket"))
    add("tcp", run.get("tcp"))
    add("no socket", run.get("socket_error"))
    if system:
        add("process", _process(system))
        gpus = system.get("gpus")
        if isinstance(gpus, list):
            for gpu in gpus:
                if isinstance(gpu, Mapping):
                    add(f"gpu {gpu.get('index')}", _gpu(gpu))
        add("gpus", system.get("gpu_error"))
    return lines


def _joined(*parts: Any) -> str | None:
    kept = [str(p) for p in parts if p is not None and p != ""]
    return ", ".join(kept) or None


def _memory(total: Any) -> str | None:
    return None if num(total) is None else f"{size(total)} of memory"


def _versions(run: Mapping[str, Any]) -> str | None:
    named = (("torch", run.get("torch")), ("CUDA", run.get("cuda")), ("tuiwatch", run.get("tuiwatch")))
    return _joined(*(f"{name} {value}" for name, value in named if value))


def _settings(run: Mapping[str, Any]) -> str | None:
    keys = ("every", "step_per", "on_nonfinite", "update_norm_every", "param_norm_every")
    return _joined(*(f"{key}={run[key]}" for key in keys if run.get(key) is not None))


def _process(system: Mapping[str, Any]) -> str | None:
    cpu = num(system.get("cpu_percent"))
    workers = integer(system.get("workers"))
    worker_cpu = system.get("workers_cpu_percent")
    loaders = None
    if workers:
        loaders = f"{workers} loader workers"
        if isinstance(worker_cpu, list) and worker_cpu:
            loaders += " at " + " ".join(f"{v:.0f}%" for v in worker_cpu if num(v) is not None)
    return _joined(
        None if cpu is None else f"CPU {cpu:.0f}%",
        None if num(system.get("rss")) is None else f"RSS {size(system.get('rss'))}",
        loaders,
    )


def _gpu(gpu: Mapping[str, Any]) -> str | None:
    util, temp, power = num(gpu.get("util")), num(gpu.get("temp")), num(gpu.get("power"))
    used = None if num(gpu.get("mem_used")) is None else size_of(gpu.get("mem_used"), gpu.get("mem_total"))
    mine = num(gpu.get("process_mem_used"))
    return _joined(
        gpu.get("device"),
        None if util is None else f"util {util:.0f}%",
        None if used is None else f"memory {used}" + ("" if mine is None else f" ({size(mine)} this run's)"),
        None if temp is None else f"{temp:.0f}°C",
        None if power is None else f"{power:.0f} W",
    )
