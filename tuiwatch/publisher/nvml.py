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


def _visible_indices(count: int) -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    out = []
    for part in visible.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < count:
            out.append(int(part))
    return out


def _field(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def sample_gpus() -> tuple[list[dict[str, Any]] | None, str | None]:
    """One reading per visible GPU, or ``(None, reason)`` when NVML cannot be used."""
    lib = _init()
    if lib is None:
        return None, _state["error"]
    count = _field(lib.nvmlDeviceGetCount) or 0
    pid = os.getpid()
    gpus = []
    for index in _visible_indices(count):
        handle = _field(lib.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            continue
        util = _field(lib.nvmlDeviceGetUtilizationRates, handle)
        mem = _field(lib.nvmlDeviceGetMemoryInfo, handle)
        power_mw = _field(lib.nvmlDeviceGetPowerUsage, handle)
        procs = _field(lib.nvmlDeviceGetComputeRunningProcesses, handle) or []
        own = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
        gpus.append(
            {
                "index": index,
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
