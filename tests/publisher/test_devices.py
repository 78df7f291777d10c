"""Devices: the CUDA event and pinned-copy logic, NVML readings, loader workers.

This machine has no NVIDIA GPU. The event and copy logic is tested through
the small interface it needs from ``torch.cuda.Event`` (``query``,
``synchronize``, ``elapsed_time``), with an event class that completes when
the test says so; the real CUDA path is checked by ``bench/gpu_check.py`` on a
GPU host.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import tuiwatch
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.writer import FileLedger
from tuiwatch.publisher import steps as steps_module
from tuiwatch.publisher.background import nvml
from tuiwatch.publisher.background.pipeline import Pipeline
from tuiwatch.publisher.background.system import loader_worker_pids
from tuiwatch.publisher.deferred import PendingCopy, PendingDuration, is_ready, resolve
from tuiwatch.publisher.pending import StepState
from tuiwatch.publisher.steps import set_aside

from ..helpers import ledger_file, wait_until

GiB = 1 << 30


class StreamEvent:
    """A stand-in for ``torch.cuda.Event``: completes when the test (or a synchronize) says so."""

    def __init__(self, at_ms: float, done: bool = False):
        self.at_ms = at_ms
        self.done = done
        self.synchronized = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized += 1
        self.done = True

    def elapsed_time(self, end: StreamEvent) -> float:
        if not (self.done and end.done):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return end.at_ms - self.at_ms


def test_a_step_waits_for_its_end_event_and_takes_the_device_time_from_it():
    s = StepState(step=3, started=0.0)
    s.data_wait_s = 0.010
    start, end = StreamEvent(1000.0, done=True), StreamEvent(1040.0)
    s.compute_s = PendingDuration(start, end, host_s=0.002)  # the host only launched the kernels
    assert not s.ready()
    end.done = True
    assert s.ready()
    record = s.build()
    assert record["compute_s"] == pytest.approx(0.040)
    assert end.synchronized == 0  # a completed event is read, never waited on (no sync call at all)
    s.batch = None
    assert record["data_wait_s"] == 0.010


def test_on_cuda_a_steps_phases_are_the_device_times_between_its_events():
    # The host launched the forward in 1 ms, waited 0.5 ms to launch the optimizer; on the device the backward
    # (with a rank's wait at the all-reduce) took 30 ms: the events say so, the host clock cannot.
    s = StepState(step=0, started=0.0)
    s.forwards, s.forward_end, s.opt_start, s.opt_end = 1, 0.001, 0.0015, 0.002
    s.device_start, s.forward_mark = StreamEvent(100.0, done=True), StreamEvent(104.0, done=True)
    s.opt_start_mark, s.opt_end_mark = StreamEvent(134.0, done=True), StreamEvent(136.0, done=True)
    end = StreamEvent(137.0)
    s.compute_s = PendingDuration(s.device_start, end, host_s=0.002)
    assert not s.ready()  # the step's end event, recorded after the phases' on the same stream
    end.done = True
    record = s.build()
    phases = [record["forward_s"], record["backward_s"], record["optimizer_s"]]
    assert phases == pytest.approx([0.004, 0.030, 0.002])
    assert record["compute_s"] == pytest.approx(0.037)
    # Without the events (a step not measured on the device), the host's times.
    s.forward_mark = None
    assert s.phases() == {"forward_s": 0.001, "backward_s": pytest.approx(0.0005), "optimizer_s": pytest.approx(0.0005)}


def test_on_cuda_an_evaluation_before_the_steps_forward_is_left_out_of_its_device_time(
    monkeypatch: pytest.MonkeyPatch,
):
    # The step opened at 100 ms on the device; a validation block ran its kernels until 300 ms; the step's own
    # work ended at 340 ms. Its device time starts again after the block: 40 ms, not 240.
    after_block = StreamEvent(300.0, done=True)
    monkeypatch.setattr(steps_module, "device_mark", lambda: after_block)
    s = StepState(step=0, started=10.0)
    s.device_start = StreamEvent(100.0, done=True)
    set_aside(s, 10.01, 10.21)
    assert s.device_start is after_block
    assert s.started == pytest.approx(10.2)  # the host clock too (the phases start there)
    s.compute_s = PendingDuration(s.device_start, StreamEvent(340.0, done=True), host_s=0.04)
    assert s.build()["compute_s"] == pytest.approx(0.040)
    # After the step's forward the start stays, and only the host time is set aside.
    later = StepState(step=1, started=20.0)
    later.forwards = 1
    set_aside(later, 20.5, 20.7)
    assert later.started == 20.0
    assert later.not_compute == pytest.approx(0.2)


def test_on_cuda_an_unmarked_loops_evaluation_after_the_update_is_left_out_of_its_device_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    # A loop that marks no steps evaluates after an epoch's last update: that step ends at the next training forward,
    # and its device time must end where the evaluation's first forward began, as its host time does. The CUDA calls
    # are stood in for (the device's clock a millisecond a mark); the real path runs in bench/gpu_check.py.
    from tuiwatch.publisher import hooks as hooks_module
    from tuiwatch.publisher import watch as watch_module

    clock = iter(range(1_000_000))
    marks: list[StreamEvent] = []

    def mark() -> StreamEvent:
        marks.append(StreamEvent(float(next(clock)), done=True))
        return marks[-1]

    for module in (steps_module, hooks_module, watch_module):
        monkeypatch.setattr(module, "device_mark", mark)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda index: 0)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda index: None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = tuiwatch.Watch(model, opt, run_dir=tmp_path, name="cuda-unmarked", system=False, quiet=True)
    watch._tracker.cuda_index = 0  # as on a GPU: steps opened at a boundary get a start event
    put: list[StepState] = []
    monkeypatch.setattr(watch._pipeline, "put", put.append)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        model.eval()
        model(x)  # the evaluation's first forward: its mark ends the step's device time
        evaluated = marks[-1]
        for _ in range(5):
            model(x)
        model.train()
    watch.close()
    last = put[-1]
    assert last.evaluated_mark is evaluated
    assert isinstance(last.compute_s, PendingDuration)
    assert last.compute_s.end is evaluated
    assert last.build()["compute_s"] == pytest.approx((evaluated.at_ms - last.device_start.at_ms) / 1000)


def test_unreadable_events_fall_back_to_the_host_time():
    start, end = StreamEvent(0.0, done=True), StreamEvent(5.0, done=True)
    start.done = False  # e.g. a stream captured into a CUDA graph: elapsed_time raises
    start.synchronize = lambda: None  # type: ignore[method-assign]
    pending = PendingDuration(start, end, host_s=0.003)
    assert is_ready(pending)
    assert resolve(pending) == 0.003


def test_a_pinned_copy_is_read_only_after_its_event_completes():
    event = StreamEvent(0.0)
    value = PendingCopy(torch.tensor(2.5), event)
    assert not is_ready(value)
    assert not is_ready([value][0])
    event.done = True
    assert is_ready(value)
    assert resolve([value, 1.0, None]) == [2.5, 1.0, None]


def test_at_close_pending_values_are_polled_for_and_never_waited_on(tmp_path: Path):
    pipeline = Pipeline(FileLedger(tmp_path / "ledger.jsonl"), system_interval_s=None)
    late, never = StreamEvent(25.0), StreamEvent(0.0)
    for step, end in ((0, late), (1, never)):
        s = StepState(step=step, started=0.0)
        s.compute_s = PendingDuration(StreamEvent(0.0, done=True), end, host_s=0.001)
        s.metrics["loss"] = PendingCopy(torch.tensor(0.75), end)
        pipeline.put(s)
    pipeline.start()
    threading.Timer(0.1, lambda: setattr(late, "done", True)).start()  # the GPU finishes step 0 a bit later
    assert pipeline.close({"kind": "end", "t": 1.0, "reason": "finished", "steps": 2, "opt_steps": 0})
    steps = [r for r in read_ledger(tmp_path / "ledger.jsonl") if r["kind"] == "step"]
    assert [(r["compute_s"], r["loss"]) for r in steps] == [
        (pytest.approx(0.025), 0.75),
        (0.001, None),  # never completed: host time and no loss, written within the close bound
    ]
    assert late.synchronized == never.synchronized == 0


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: bench/gpu_check.py runs this on a GPU host"
)
def test_on_cuda_compute_time_comes_from_events(run_root: Path, socket_dir: Path):
    model = nn.Linear(8, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = tuiwatch.Watch(model, optimizer, run_dir=run_root)
    for x in watch.batches([torch.randn(4, 8, device="cuda") for _ in range(5)]):
        model(x).sum().backward()
        optimizer.step()
    watch.close()
    run, *rest = list(read_ledger(ledger_file(run_root)))
    assert run["mem_total"] == torch.cuda.get_device_properties(0).total_memory
    steps = [r for r in rest if r["kind"] == "step"]
    assert all(r["compute_s"] > 0 and r["mem_allocated"] > 0 for r in steps)
    phases = [(r["forward_s"], r["backward_s"], r["optimizer_s"], r["compute_s"]) for r in steps]
    assert all(f > 0 and b > 0 and o > 0 and f + b + o <= c + 1e-6 for f, b, o, c in phases), phases


class StandInNvml:
    """The few ``pynvml`` calls tuiwatch makes, over four made-up GPUs (there is no driver here)."""

    class Reading:
        def __init__(self, **fields: Any):
            self.__dict__.update(fields)

    def __init__(self, pid: int):
        self.pid = pid

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return {"GPU-aaaa": 2}[uuid]

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Reading:
        return self.Reading(gpu=10 * handle)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Reading:
        return self.Reading(used=handle * GiB, total=80 * GiB)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 3:
            raise RuntimeError("NVMLError_NotSupported")  # a field the driver does not give is null
        return 300_000

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 60

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Reading]:
        mine = [self.Reading(pid=self.pid, usedGpuMemory=GiB)] if handle == 3 else []
        return [self.Reading(pid=1, usedGpuMemory=5 * GiB), *mine]


def test_nvml_readings_follow_cuda_visible_devices_with_the_runs_gpu_first(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(nvml, "_state", {"tried": True, "error": None, "pynvml": StandInNvml(os.getpid())})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3,GPU-aaaa")
    gpus, error = nvml.sample_gpus(first=1)
    assert error is None
    assert gpus is not None
    assert [(g["device"], g["index"]) for g in gpus] == [("cuda:1", 3), ("cuda:0", 1), ("cuda:2", 2)]
    run_gpu = gpus[0]
    assert run_gpu == {
        "index": 3,
        "device": "cuda:1",
        "util": 30,
        "mem_used": 3 * GiB,
        "mem_total": 80 * GiB,
        "temp": 60,
        "power": None,
        "process_mem_used": GiB,
    }
    assert gpus[1]["power"] == 300.0
    assert gpus[1]["process_mem_used"] is None  # only another process on that GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7,2")  # CUDA stops at the first invalid entry
    gpus, _ = nvml.sample_gpus()
    assert [g["index"] for g in gpus or []] == [0]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    gpus, _ = nvml.sample_gpus(first=9)
    assert [g["device"] for g in gpus or []] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


class SlowItems(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.full((4,), float(index))


# Spawned and forkserver workers start a Python of their own each (a few seconds here): a real process matters.
@pytest.mark.integration
@pytest.mark.parametrize("start", ["fork", "spawn", "forkserver"])  # forkserver: Python 3.14's default on Linux
def test_loader_workers_are_counted_while_iterating_and_other_children_are_not(
    start: str, run_root: Path, socket_dir: Path
):
    """With a forkserver the workers are the server's children, and the run's own children were the server and
    multiprocessing's resource tracker: "2 workers" at 0 % CPU. A program the run started (a compile worker pool,
    a logger's service) counted as a loader worker."""
    # An earlier test's workers may still be exiting on a loaded machine: they are this process's workers too.
    wait_until(lambda: not loader_worker_pids({}), timeout=60, what="earlier loader workers to exit")
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    other = subprocess.Popen(["sleep", "60"])  # a child that is no loader worker
    watch = tuiwatch.Watch(model, optimizer, run_dir=run_root, system=0.05)
    loader = DataLoader(SlowItems(), batch_size=4, num_workers=2, multiprocessing_context=start)
    seen: list[dict[str, Any]] = []

    def both_busy() -> bool:  # the two workers counted, and their own CPU measured (not a helper's idle 0 %)
        return any(r["workers"] == 2 and max(r["workers_cpu_percent"]) > 0 for r in seen)

    deadline = time.monotonic() + 60
    try:
        for x in watch.batches(loader):
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            seen = [
                r
                for r in read_ledger(ledger_file(run_root))
                if r["kind"] == "system" and r["workers"] and len(r["workers_cpu_percent"]) == r["workers"]
            ]
            if both_busy() or time.monotonic() > deadline:
                break
    finally:
        watch.close()
        other.kill()
        other.wait()
    assert seen, "no system record counted the workers within 60 s"
    assert both_busy()
    # Never more: a record may count one while the second still starts (a loaded machine), never a helper.
    assert max(r["workers"] for r in seen) == 2


# --- the pane ------------------------------------------------------------------------------
