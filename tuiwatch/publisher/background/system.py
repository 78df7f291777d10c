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
        self._kinds: dict[int, str] = {}  # each child's kind (loader_worker_pids), by pid
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
        pids = loader_worker_pids(self._kinds)
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


# What a child process of the training process is to the loader, by its command line (read once a pid).
WORKER, FORKSERVER, OTHER = "worker", "forkserver", "other"


def loader_worker_pids(kinds: dict[int, str]) -> list[int]:
    """The processes that may make the loop's batches: this process's multiprocessing children.

    A DataLoader's workers are forked (their command line is this process's), spawned (``--multiprocessing-fork``),
    or forked by a forkserver, Python 3.14's default on Linux: children of that server, which is this process's
    child. Not workers: multiprocessing's resource tracker and the forkserver itself, and a program the run
    started (a compile worker pool, a logger's service process), which counted as loader workers and hid a
    forkserver's real ones. ``kinds`` caches each child's kind by pid.
    """
    workers: list[int] = []
    children = child_pids() or []
    for pid in kinds.keys() - children:
        del kinds[pid]  # gone (each epoch's workers, without persistent_workers, are new processes)
    for pid in children:
        kind = kinds.get(pid)
        if kind is None:
            kind = kinds[pid] = _kind_of(pid)
        if kind == WORKER:
            workers.append(pid)
        elif kind == FORKSERVER:
            workers += child_pids(pid) or []  # forked from the server: each is a worker
    return workers


def _kind_of(pid: int) -> str:
    try:
        args = psutil.Process(pid).cmdline()
    except psutil.Error:
        return OTHER
    if args == _own_cmdline() or "--multiprocessing-fork" in args:
        return WORKER
    if any("multiprocessing.forkserver import main" in a for a in args):
        return FORKSERVER
    return OTHER


def _own_cmdline() -> list[str]:
    try:
        return psutil.Process().cmdline()
    except psutil.Error:
        return []


def child_pids(pid: int | None = None) -> list[int] | None:
    """The children of this process (or of ``pid``), from each of its threads' ``children`` file (Linux); psutil's
    answer where there is none.

    psutil finds children by reading every process on the host: 1.2 ms a sample with 65 processes,
    tens of ms on a shared server with thousands. These files list them directly.
    """
    where = f"/proc/{pid if pid is not None else 'self'}/task"
    try:
        tasks = os.listdir(where)
        pids: list[int] = []
        for task in tasks:
            # A thread that just ended has no file any more.
            with (
                contextlib.suppress(FileNotFoundError, ProcessLookupError),
                open(f"{where}/{task}/children", "rb") as f,
            ):
                pids += map(int, f.read().split())
    except OSError:
        return _psutil_children(pid)
    if not pids and not os.path.exists(f"{where}/{tasks[0]}/children"):
        return _psutil_children(pid)  # a kernel without the files (CONFIG_PROC_CHILDREN off)
    return pids


def _psutil_children(pid: int | None) -> list[int] | None:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=False)]
    except psutil.Error:
        return None
