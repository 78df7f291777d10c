"""Sources other than a live socket, and choosing a run: follow mode, a command's stdio, the picker."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from tuiwatch.viewer.screens.run_picker import RunPicker
from tuiwatch.viewer.sources import CommandSource, FileSource
from tuiwatch.wire.discovery import LiveRun, resolve_target

from ..helpers import finish, start_training, wait_until
from ..viewer_helpers import FIXED_NOW, RecordingApp, until

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"


def line(record: dict[str, object]) -> bytes:
    return orjson.dumps(record) + b"\n"


async def test_follow_picks_up_records_appended_later_even_across_a_torn_write(tmp_path: Path):
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(line({"kind": "run", "t": 1.0, "name": "grow", "run_id": "g"}))
    app = RecordingApp(FileSource(path, follow=True, poll_s=0.02), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.status == "live")
        whole = line({"kind": "step", "t": 2.0, "step": 0, "loss": 0.5})
        with open(path, "ab") as f:
            f.write(whole[:10])  # the writer is mid-line
            f.flush()
            await pilot.pause(0.1)
            assert app.state.step is None
            f.write(whole[10:] + line({"kind": "step", "t": 3.0, "step": 1, "loss": 0.25}))
        await until(pilot, lambda: app.state.step == 1, what="the appended steps")
        assert app.state.metrics["loss"].current == 0.25


async def test_a_command_speaking_the_wire_protocol_feeds_the_viewer():
    argv = [
        sys.executable,
        "-c",
        f"import sys; sys.stdout.buffer.write(open({str(LEDGERS / 'healthy.jsonl')!r}, 'rb').read())",
    ]
    app = RecordingApp(CommandSource(argv, label="relay"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.status == "finished")
        assert app.state.step == 149


async def test_a_commands_records_are_shown_without_waiting_for_more_bytes():
    # One run record, then silence: the record must reach the viewer while the command still runs.
    record = line({"kind": "run", "t": 1.0, "name": "quiet", "run_id": "q"}).decode().strip()
    argv = [sys.executable, "-c", f"import sys, time; print({record!r}, flush=True); time.sleep(60)"]
    source = CommandSource(argv, label="relay")
    app = RecordingApp(source, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.name == "quiet", 30, "the record before the command ends")
        assert source._proc is not None
        assert source._proc.poll() is None  # still running: nothing after it pushed it out


async def test_a_failing_command_says_why():
    argv = [
        sys.executable,
        "-c",
        "import sys; sys.stderr.write('ssh: Could not resolve hostname nowhere\\n'); sys.exit(255)",
    ]
    app = RecordingApp(CommandSource(argv), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.status == "disconnected")
        await until(pilot, lambda: "ssh: Could not resolve hostname nowhere" in app.notes, what="the reason")


async def test_the_picker_returns_the_chosen_run():
    runs = [
        LiveRun("a", 1, "/tmp/a.1.sock", 3, "live", "x", None),
        LiveRun("b", 2, "/tmp/b.2.sock", 9, "live", "y", None),
    ]
    picker = RunPicker(runs)
    async with picker.run_test(size=(80, 24)) as pilot:
        await pilot.press("down", "enter")
    assert picker.return_value is runs[1]


@pytest.mark.integration
def test_a_target_can_be_a_pid_or_a_socket_path(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--name", "bypid", "--steps", "300", "--step-sleep", "0.005")
    sock = wait_until(lambda: next(iter(socket_dir.glob("*.sock")), None), what="socket")
    by_pid = resolve_target(str(proc.pid), socket_dir)
    by_path = resolve_target(str(sock), socket_dir)
    assert isinstance(by_pid, LiveRun)
    assert isinstance(by_path, LiveRun)
    assert (by_pid.name, by_pid.socket) == ("bypid", str(sock)) == (by_path.name, by_path.socket)
    finish(proc)
