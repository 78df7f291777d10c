"""What peers and crashes do to a run: a flood of connections, viewers killed mid-stream, a writer killed mid-line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuiwatch.analysis.report import as_text, summarize
from tuiwatch.ledger.codec import encode
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.wire.protocol import connect, iter_records
from tuiwatch.wire.socketdir import list_sockets

from ..helpers import (
    LOADED_MACHINE_S,
    SCRIPTS,
    count_steps,
    finish,
    ledger_file,
    records,
    start_training,
    wait_for_ledger,
    wait_until,
)

pytestmark = pytest.mark.integration  # floods, kills and full disks against real processes


def _socket(socket_dir: Path) -> Path:
    return wait_until(lambda: next(iter(list_sockets(socket_dir)), None), what="the run's socket").path


def _try_connect(path: Path) -> socket.socket | None:
    try:
        return connect(path, timeout=5)
    except BlockingIOError:
        return None  # the listen backlog is full for now: the server drains it every cycle


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_flood_of_connections_and_killed_viewers_leave_no_fd_and_the_run_finishes(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--steps", "1500", "--step-sleep", "0.002")
    path = _socket(socket_dir)
    ledger = wait_for_ledger(run_root)
    wait_until(lambda: count_steps(ledger) > 10, what="steps")
    baseline = _fds(proc.pid)
    # Hundreds of connections opened at once, then dropped without a word.
    flood = []
    for _ in range(300):
        try:
            flood.append(connect(path, timeout=5))
        except OSError:
            break  # the backlog is full: the flood is refused, the run goes on
    assert len(flood) >= 64
    for s in flood:
        s.close()
    # 100 viewers that read a little and die abruptly (RST instead of FIN).
    for _ in range(100):
        viewer = wait_until(lambda: _try_connect(path), what="a connection")
        viewer.recv(4096)
        viewer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        viewer.close()
    wait_until(lambda: _fds(proc.pid) <= baseline + 2 or None, what="the run to close every dead connection")
    # A new viewer still gets the run at once.
    started = time.monotonic()
    fresh = wait_until(lambda: _try_connect(path), what="a connection")
    first = next(iter_records(fresh))
    assert first["kind"] == "run"
    assert time.monotonic() - started < LOADED_MACHINE_S  # not stuck behind the dead connections
    fresh.close()
    _, err = finish(proc)
    assert "Traceback" not in err
    assert records(ledger_file(run_root))[-1]["reason"] == "finished"
    assert count_steps(ledger) == 1500


def test_a_writer_killed_mid_write_leaves_a_clean_prefix(tmp_path: Path):
    # Writers forked and killed at random moments of their writing, until 20 kills landed inside a write (or 1,000
    # rounds): by a small process of its own, whose forks are quick (the script says why).
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "killed_writers.py"), str(tmp_path), "--torn", "20", "--rounds", "1000"],
        capture_output=True,
        text=True,
        timeout=110,
        check=True,
    )
    told = json.loads(done.stdout)
    torn = 0
    for round_ in range(told["rounds"]):
        reader = read_ledger(tmp_path / f"ledger-{round_}.jsonl")
        steps = [r["step"] for r in reader]
        assert steps == list(range(len(steps)))  # a clean prefix: nothing missing, nothing mangled
        assert reader.skipped <= 1  # at most the one torn last line
        torn += reader.skipped
    assert torn == told["torn"]
    assert torn >= 1, f"no kill landed inside a write in {told['rounds']} rounds: the test tested nothing"


def test_a_full_disk_leaves_the_ledger_on_a_record_boundary_and_the_run_goes_on(run_root: Path, socket_dir: Path):
    # RLIMIT_FSIZE makes the kernel refuse writes past 20 kB, as a full disk would (EFBIG instead of ENOSPC).
    proc = start_training(run_root, socket_dir, "--steps", "300", "--step-sleep", "0.002", "--max-file-bytes", "20000")
    path = _socket(socket_dir)
    viewer = connect(path, timeout=10)
    seen = []
    for record in iter_records(viewer):
        seen.append(record)
        if record.get("kind") == "end":
            break
    _, err = finish(proc)
    assert "tuiwatch: publisher degraded (OSError: [Errno 27] File too large); training continues" in err
    ledger = ledger_file(run_root)
    assert ledger.stat().st_size <= 20000
    reader = read_ledger(ledger)
    on_disk = list(reader)
    assert reader.skipped == 0  # cut back to the last whole record
    steps_on_disk = [r["step"] for r in on_disk if r["kind"] == "step"]
    steps_seen = [r["step"] for r in seen if r["kind"] == "step"]
    assert steps_seen == list(range(300))  # the viewer got every step, from memory after the disk filled
    assert steps_on_disk == list(range(len(steps_on_disk)))
    assert len(steps_on_disk) < 300
    assert seen[-1]["status"] == "degraded"


def test_when_space_returns_the_ledger_records_the_gap_and_goes_on(run_root: Path, socket_dir: Path):
    proc = start_training(
        run_root,
        socket_dir,
        "--steps",
        "400",
        "--step-sleep",
        "0.002",
        "--max-file-bytes",
        "20000",
        "--disk-back-at-step",
        "200",
    )
    _, err = finish(proc)
    assert err.count("tuiwatch: publisher degraded") == 1
    reader = read_ledger(ledger_file(run_root))
    on_disk = list(reader)
    assert reader.skipped == 0
    gaps = [r for r in on_disk if r["kind"] == "gap"]
    assert len(gaps) == 1
    gap = gaps[0]
    first, last = gap["steps"]
    steps_on_disk = [r["step"] for r in on_disk if r["kind"] == "step"]
    # Everything before the disk filled, the gap, then everything after it: no step twice, none unaccounted for.
    assert steps_on_disk == list(range(first)) + list(range(last + 1, 400))
    assert 0 < first <= last < 400
    assert gap["records"] >= last - first + 1
    assert gap["error"] == "OSError: [Errno 27] File too large"
    assert gap["from_t"] <= gap["to_t"] <= gap["t"]
    assert on_disk[-1]["kind"] == "end"
    assert on_disk[-1]["reason"] == "finished"
    report = as_text(summarize(on_disk))
    assert f"missing    {gap['records']} records the disk could not take (see the gap records)" in report


def test_a_viewer_still_in_the_listen_backlog_at_close_is_served_the_run_not_reset(tmp_path: Path):
    import selectors

    from tuiwatch.ledger.writer import MemoryTail
    from tuiwatch.publisher.background.server import Server, bind_private_socket

    path = tmp_path / "run.sock"
    store = MemoryTail()
    run_line = encode({"kind": "run", "t": 0.0, "name": "closing"})
    store.append(run_line + encode({"kind": "step", "step": 0}) + encode({"kind": "end", "reason": "finished"}))
    with selectors.DefaultSelector() as selector:
        server = Server(bind_private_socket(path), path, store, run_line, lambda command: None, selector)
        viewer = connect(path, timeout=10)  # connected in the kernel; nobody has accepted it yet
        server.close()
        received = list(iter_records(viewer))  # ConnectionResetError before the close took the backlog in
    viewer.close()
    assert [r["kind"] for r in received] == ["run", "step", "end"]
