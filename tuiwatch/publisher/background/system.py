"""About once a second: this process's CPU, memory, loader workers, and the GPUs."""

from __future__ import annotations

import contextlib
import os
import time

import psutil

from tuiwatch.ledger.records import SystemRecord
from tuiwatch.publisher.background import nvml

IDLE_FACTOR = 3


class SystemSampler:
    def __init__(self, interval_s: float = 1.0, cuda_device: int | None = None):
        self.interval_s = interval_s
        self.cuda_device = cuda_device  # the run's GPU, read first
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first reading only starts the interval
        self._children: dict[int, psutil.Process] = {}
        self._next = 0.0

    def due(self, now: float, idle: bool = False) -> bool:
        """Whether to sample now: every ``interval_s``, and every ``IDLE_FACTOR`` of them while nothing else
        happens (a paused run, a long evaluation: its memory still shows, at a third of the cost)."""
        return now >= self._next + (IDLE_FACTOR - 1) * self.interval_s * idle

    def sample(self, now: float) -> SystemRecord:
        self._next = now + self.interval_s
        record: SystemRecord = {"kind": "system", "t": time.time()}
        with self._proc.oneshot():
            record["cpu_percent"] = self._proc.cpu_percent(None)
            record["rss"] = self._proc.memory_info().rss
        record["workers"], record["workers_cpu_percent"] = self._workers()
        gpus, error = nvml.sample_gpus(first=self.cuda_device)
        record["gpus"] = gpus
        if error is not None:
            record["gpu_error"] = error
        return record

    def _workers(self) -> tuple[int, list[float]]:
        pids = child_pids()
        if pids is None:
            try:
                pids = [c.pid for c in self._proc.children(recursive=False)]
            except psutil.Error:
                return 0, []
        alive: dict[int, psutil.Process] = {}
        cpu: list[float] = []
        for pid in pids:
            try:
                # Reuse Process objects so that cpu_percent measures since the last sample.
                proc = self._children.get(pid) or psutil.Process(pid)
                cpu.append(proc.cpu_percent(None))
            except psutil.Error:
                continue
            alive[pid] = proc
        self._children = alive
        return len(alive), cpu


def child_pids() -> list[int] | None:
    """This process's children, from each of its threads' ``children`` file (Linux); None where there is none.

    psutil finds children by reading every process on the host: 1.2 ms a sample with 65 processes,
    tens of ms on a shared server with thousands. These files list them directly.
    """
    try:
        tasks = os.listdir("/proc/self/task")
        pids: list[int] = []
        for task in tasks:
            # A thread that just ended has no file any more.
            with (
                contextlib.suppress(FileNotFoundError, ProcessLookupError),
                open(f"/proc/self/task/{task}/children", "rb") as f,
            ):
                pids += map(int, f.read().split())
    except OSError:
        return None
    if not pids and not os.path.exists(f"/proc/self/task/{tasks[0]}/children"):
        return None  # a kernel without the files (CONFIG_PROC_CHILDREN off): ask psutil
    return pids
