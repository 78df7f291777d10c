"""Forked loader workers and a killed run: one ledger, always readable."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from torch import nn

import tuiwatch
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.wire.socketdir import list_sockets

from ..helpers import (
    LOADED_MACHINE_S,
    count_steps,
    env_for,
    finish,
    ledger_file,
    load_truth,
    records,
    start_training,
    wait_for_ledger,
    wait_until,
)

pytestmark = pytest.mark.integration  # signals and exits of real training processes


def test_dataloader_workers_do_not_inherit_a_live_publisher(run_root: Path, socket_dir: Path, tmp_path: Path):
    truth = tmp_path / "truth.jsonl"
    proc = start_training(run_root, socket_dir, "--steps", "24", "--workers", "2", truth=truth)
    finish(proc, timeout=90)
    ledger = ledger_file(run_root)  # exactly one run directory
    all_records = records(ledger)
    assert [r["kind"] for r in all_records].count("run") == 1
    assert [r["kind"] for r in all_records].count("end") == 1
    steps = [r for r in all_records if r["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(24))
    assert [s["batch_ids"] for s in steps] == [t["ids"] for t in load_truth(truth)]
    assert {r["pid"] for r in all_records if "pid" in r} == {all_records[0]["pid"]}
    assert list_sockets(socket_dir) == []


def test_a_run_killed_mid_write_leaves_a_readable_ledger(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--steps", "100000", "--step-sleep", "0.0005", "--samples", "4096")
    ledger = wait_for_ledger(run_root)
    wait_until(lambda: count_steps(ledger) >= 200, what="200 steps")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reader = read_ledger(ledger)
    steps = [r["step"] for r in reader if r["kind"] == "step"]
    assert reader.skipped <= 1
    assert steps == list(range(len(steps)))
    assert len(steps) >= 200


def test_sigterm_ends_the_ledger_with_reason_killed_and_exits_at_once(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--steps", "100000", "--step-sleep", "0.005")
    ledger = wait_for_ledger(run_root)
    wait_until(lambda: count_steps(ledger) > 5, what="steps")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    # Designed and measured to take under 2 s (docs/architecture.md); this protects against a hang (a
    # handler that waits on the loop, a join without a timeout), with room for a loaded CI machine.
    assert time.monotonic() - sent < LOADED_MACHINE_S
    assert proc.returncode == 143
    last = records(ledger)[-1]
    assert last["kind"] == "end"
    assert last["reason"] == "killed"
    assert not list(socket_dir.glob("*.sock"))  # no socket left behind


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_sigint_ends_the_ledger_stopped_and_leaves_no_worker_behind(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--steps", "100000", "--step-sleep", "0.005", "--workers", "2")
    ledger = wait_for_ledger(run_root)
    wait_until(lambda: count_steps(ledger) > 5, what="steps")
    workers = wait_until(lambda: _children(proc.pid) if len(_children(proc.pid)) >= 2 else None, what="2 workers")
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    assert time.monotonic() - sent < LOADED_MACHINE_S  # as for SIGTERM: no hang, whatever the load
    assert proc.returncode != 0  # KeyboardInterrupt ends the script
    last = records(ledger)[-1]
    assert (last["kind"], last["reason"]) == ("end", "stopped")
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []
    assert not list(socket_dir.glob("*.sock"))


def test_interpreter_exit_with_a_hung_disk_is_bounded(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--steps", "60", "--hang-disk-at-step", "30", "--no-close")
    assert proc.stdout is not None
    line = wait_until(lambda: proc.stdout.readline() if proc.stdout else None, what="the loop's end")  # type: ignore[union-attr]
    assert line.strip() == "loop done"
    done = time.monotonic()
    proc.wait(30)
    # close() gives up on a write blocked 1 s (1.85 s measured on an idle machine); a close that waited
    # for the hung disk would never return: the bound protects against that, not the exact figure.
    assert time.monotonic() - done < LOADED_MACHINE_S
    assert proc.returncode == 0
    steps = [r["step"] for r in records(ledger_file(run_root)) if r["kind"] == "step"]
    assert steps == list(range(len(steps)))  # what reached the disk before it hung is whole


WORKERS_WITHOUT_WITH = """
import sys
import multiprocessing as mp
import torch
from tuiwatch import Watch

def train(rank, run_dir, fail):
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    watch = Watch(model, optimizer, name=f"worker{rank}", run_dir=run_dir, quiet=True, system=False)  # no `with`
    for _ in range(7):
        watch.step()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        watch.log(loss=loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if fail:
        raise ValueError("the worker's own bug")

if __name__ == "__main__":
    method, run_dir = sys.argv[1], sys.argv[2]
    workers = [mp.get_context(method).Process(target=train, args=(rank, run_dir, rank == 1)) for rank in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print("exit codes", [w.exitcode for w in workers])
"""


def _run_workers(
    source: str, tmp_path: Path, socket_dir: Path, method: str, run_root: Path
) -> subprocess.CompletedProcess[str]:
    """``source``, a script that starts multiprocessing workers by ``method``, run with its run directory."""
    script = tmp_path / "workers.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), method, str(run_root)],
        env=env_for(socket_dir),
        capture_output=True,
        text=True,
        timeout=120,  # spawned interpreters import torch
    )


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])  # (forkserver: 3.14's default on Linux)
def test_a_watch_in_a_multiprocessing_worker_ends_its_ledger_without_a_with_block(
    method: str, run_root: Path, socket_dir: Path, tmp_path: Path
):
    # Under fork the worker ends with os._exit (no atexit hook); under either, its target's exception is caught
    # by multiprocessing and never reaches sys.excepthook. Each worker's ledger must still end, with the reason.
    done = _run_workers(WORKERS_WITHOUT_WITH, tmp_path, socket_dir, method, run_root)
    assert done.stdout == "exit codes [0, 1]\n", done.stderr
    ends = {}
    for ledger in run_root.glob("*/ledger.jsonl"):
        run = records(ledger, "run")[0]
        assert [s["step"] for s in records(ledger, "step")] == list(range(7))
        ends[run["name"]] = [(e["reason"], e["steps"]) for e in records(ledger, "end")]
    assert ends == {"worker0": [("finished", 7)], "worker1": [("exception", 7)]}
    assert list_sockets(socket_dir) == []


HANDLED_IN_A_WORKER = """
import sys, traceback
import multiprocessing as mp
import torch
from tuiwatch import Watch

def train(run_dir):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    watch = Watch(model, optimizer, name="worker", run_dir=run_dir, quiet=True, system=False)  # no `with`
    for _ in range(3):
        watch.step()
        try:
            raise OSError("a shard to retry")
        except OSError:
            traceback.print_exc()  # the loop's own: handled, and the run goes on
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

if __name__ == "__main__":
    worker = mp.get_context(sys.argv[1]).Process(target=train, args=(sys.argv[2],))
    worker.start()
    worker.join()
    print("exit code", worker.exitcode)
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])  # (forkserver: 3.14's default on Linux)
def test_an_exception_a_worker_handled_and_printed_does_not_end_its_ledger_as_one(
    method: str, run_root: Path, socket_dir: Path, tmp_path: Path
):
    # From Python 3.13 a worker's uncaught exception is seen where multiprocessing prints it (traceback.print_exc
    # called by its _bootstrap): a print_exc() of the loop's own is not that.
    done = _run_workers(HANDLED_IN_A_WORKER, tmp_path, socket_dir, method, run_root)
    assert done.stdout == "exit code 0\n", done.stderr
    assert done.stderr.count("OSError: a shard to retry") == 3
    assert [(e["reason"], e["steps"]) for e in records(ledger_file(run_root), "end")] == [("finished", 3)]


def test_a_child_forked_while_the_publisher_thread_held_its_stop_flag_does_not_hang(run_root: Path, socket_dir: Path):
    """A DataLoader forks its workers whenever the loop starts an epoch; the publisher thread may be setting its
    pipeline's stop flag at that moment (a collected Watch's close runs on whatever thread collects it). The
    child's fork handler set the same flag and waited forever on the lock the parent's thread held at the fork:
    a worker that never starts hangs the training loop waiting for its batch."""
    watch = tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, system=False, quiet=True)
    flag_lock = watch._pipeline._stopping._cond  # type: ignore[attr-defined]  # threading.Event's own condition
    try:
        assert _forked_while_held(flag_lock, lambda: None, timeout=10) == 0  # its fork handlers ran, or hang
    finally:
        watch.close()


@pytest.mark.parametrize("lock", ["startup._binding", "clipping._lock", "scripting._lock"])
def test_a_child_forked_while_another_thread_started_a_watch_starts_its_own(
    lock: str, run_root: Path, socket_dir: Path
):
    """A hogwild child makes its own Watch; another thread of the parent may have been starting or closing one at
    the fork, holding a lock of the publisher's modules (a socket's free name, torch's clip functions, TorchScript's
    hook filter), which no thread of the child releases."""
    module, name = lock.split(".")
    held = getattr(importlib.import_module(f"tuiwatch.publisher.{module}"), name)

    def start_a_watch() -> None:
        tuiwatch.Watch(nn.Linear(2, 2), run_dir=None, system=False, quiet=True).close()

    assert _forked_while_held(held, start_a_watch, timeout=30) == 0


def _forked_while_held(lock: Any, in_child: Callable[[], None], timeout: float) -> int:
    """Fork while another thread holds ``lock`` (released in the parent right after); the child runs ``in_child``
    and exits 0, or 1 if it raised. The child's exit code; the test fails if it has not ended within ``timeout``."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            in_child()
            code = 0
        finally:
            os._exit(code)
    release.set()
    holder.join()
    return _exit_code_within(pid, timeout)


def _exit_code_within(pid: int, timeout: float) -> int:
    """A forked child's exit code once it ends; the test fails (and the child is killed) if it has not in time."""

    def ended() -> tuple[int, int] | None:  # (a pair: an exit status of 0 is falsy)
        done = os.waitpid(pid, os.WNOHANG)
        return done if done[0] == pid else None

    try:
        _, status = wait_until(ended, timeout=timeout, what="the forked child to exit")
    except AssertionError:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    return os.waitstatus_to_exitcode(status)
