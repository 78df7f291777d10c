"""The only module that talks to NVML (the ``pynvml`` module of ``nvidia-ml-py``).

Initialised lazily on first use; a missing library or driver is a value
(``gpus: null`` plus a reason), never an exception into the sampler.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from typing import Any

_state: dict[str, Any] = {"tried": False, "error": None, "pynvml": None}


def _init() -> Any:
    if _state["tried"]:
        return _state["pynvml"]
    _state["tried"] = True
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors
        _state["error"] = f"NVML unavailable ({exc})" if str(exc) else f"NVML unavailable ({type(exc).__name__})"
        return None
    _state["pynvml"] = pynvml
    atexit.register(_shutdown)
    return pynvml


def _shutdown() -> None:
    lib = _state["pynvml"]
    if lib is not None:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()
        _state["pynvml"] = None


def _visible(lib: Any, count: int) -> list[tuple[int, Any]]:
    """``(NVML index, handle)`` of each GPU this process can see, in CUDA's order (cuda:0 first)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    parts = [str(i) for i in range(count)] if visible is None else [p.strip() for p in visible.split(",")]
    out = []
    for part in parts:
        index: int | None
        if part.isdigit():
            index = int(part)
            handle = _field(lib.nvmlDeviceGetHandleByIndex, index) if index < count else None
        elif part.startswith(("GPU-", "MIG-")):
            handle = _field(lib.nvmlDeviceGetHandleByUUID, part)
            index = _field(lib.nvmlDeviceGetIndex, handle) if handle is not None else None
        else:
            break  # CUDA stops at the first entry it cannot parse
        if handle is None or index is None:
            break
        out.append((index, handle))
    return out


def _field(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def sample_gpus(first: int | None = None) -> tuple[list[dict[str, Any]] | None, str | None]:
    """One reading per visible GPU, or ``(None, reason)`` when NVML cannot be used.

    ``first``: the CUDA index of the run's device, whose reading comes first
    (on an 8-GPU server the pane has room for a line or two).
    """
    lib = _init()
    if lib is None:
        return None, _state["error"]
    count = _field(lib.nvmlDeviceGetCount) or 0
    pid = os.getpid()
    visible = list(enumerate(_visible(lib, count)))
    if first is not None and 0 <= first < len(visible):
        visible.insert(0, visible.pop(first))
    gpus = []
    for cuda_index, (index, handle) in visible:
        util = _field(lib.nvmlDeviceGetUtilizationRates, handle)
        mem = _field(lib.nvmlDeviceGetMemoryInfo, handle)
        power_mw = _field(lib.nvmlDeviceGetPowerUsage, handle)
        procs = _field(lib.nvmlDeviceGetComputeRunningProcesses, handle) or []
        own = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
        gpus.append(
            {
                "index": index,
                "device": f"cuda:{cuda_index}",
                "util": None if util is None else util.gpu,
                "mem_used": None if mem is None else mem.used,
                "mem_total": None if mem is None else mem.total,
                "temp": _field(lib.nvmlDeviceGetTemperature, handle, 0),  # 0: NVML_TEMPERATURE_GPU
                "power": None if power_mw is None else power_mw / 1000.0,
                "process_mem_used": sum(own) if own else None,
            }
        )
    return gpus, None


def driver_version() -> str | None:
    """The NVIDIA driver's version, or None without NVML."""
    lib = _init()
    if lib is None:
        return None
    version = _field(lib.nvmlSystemGetDriverVersion)
    return version.decode() if isinstance(version, bytes) else version
