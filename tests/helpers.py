"""Shared test helpers: deadlines instead of sleeps, and a real training subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.records import Record

T = TypeVar("T")
SCRIPTS = Path(__file__).parent / "scripts"
TRAIN_SCRIPT = SCRIPTS / "train.py"


# A bound for "it did not hang": a promise measured on an idle machine (docs, bench/) with room for a CI
# machine running other jobs on the same 2 cores. Tests assert behaviour; speed is for bench/.
LOADED_MACHINE_S = 15.0


def wait_until(predicate: Callable[[], T | None], timeout: float = 20.0, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def env_for(socket_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TUIWATCH_DIR"] = str(socket_dir)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# Training processes started by the running test; conftest kills what a failed test left behind.
STARTED: list[subprocess.Popen[str]] = []


def start_training(run_root: Path, socket_dir: Path, *args: str, truth: Path | None = None) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(TRAIN_SCRIPT), "--run-dir", str(run_root), *args]
    if truth is not None:
        cmd += ["--truth", str(truth)]
    proc = subprocess.Popen(cmd, env=env_for(socket_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    STARTED.append(proc)
    return proc


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc`` and every process under it (torchrun's ranks outlive a killed launcher), then reap it."""
    try:
        tree = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait(30)


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"training exited {proc.returncode}:\n{err}"
    return out, err


def ledger_file(run_root: Path) -> Path:
    runs = list(run_root.glob("*/ledger.jsonl"))
    assert len(runs) == 1, f"expected one ledger under {run_root}, found {runs}"
    return runs[0]


def wait_for_ledger(run_root: Path, timeout: float = 20.0) -> Path:
    return wait_until(lambda: next(iter(run_root.glob("*/ledger.jsonl")), None), timeout, "the ledger file")


def records(path: Path, kind: str | None = None) -> list[Record]:
    return [r for r in read_ledger(path) if kind is None or r["kind"] == kind]


def watch_steps(watch: Any) -> list[Record]:
    """The step records a Watch (closed, or still running) has written to its ledger."""
    assert watch.ledger_path is not None
    return records(watch.ledger_path, "step")


def count_steps(path: Path) -> int:
    return len(records(path, "step"))


def load_truth(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
