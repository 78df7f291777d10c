"""Two runs of one name in one process: each has a socket of its own, and a viewer can reach and tell apart both.

Written after a script with two Watches of its default name (a generator and a discriminator, each watched) printed
"tuiwatch attach gan" twice: the second Watch had renamed its socket over the first's, which no viewer could reach
for the rest of the run.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

import pytest
from torch import nn

import tuiwatch
from tests.helpers import wait_until
from tuiwatch.viewer.messages import RecordsReceived, SourceDisconnected
from tuiwatch.viewer.screens.run_picker import RunPicker
from tuiwatch.viewer.sources import SocketSource
from tuiwatch.wire.discovery import LiveRun, find_socket_by_name, list_live_runs, resolve_target
from tuiwatch.wire.protocol import connect, iter_records
from tuiwatch.wire.socketdir import SocketId, socket_path


def _run_record(path: Path) -> dict[str, object]:
    sock = connect(path, timeout=10)
    try:
        return dict(next(iter_records(sock)))
    finally:
        sock.close()


def test_two_watches_of_one_name_open_at_once_each_keep_a_socket_a_viewer_reaches(
    run_root: Path, socket_dir: Path, capsys: pytest.CaptureFixture[str]
):
    first = tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name="twin", system=False, tcp=True)
    second = tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name="twin", system=False, tcp=True)
    assert first.socket_path == socket_path(socket_dir, "twin", os.getpid())
    assert second.socket_path is not None
    assert second.socket_path.name == f"twin-2.{os.getpid()}.sock"
    for watch in (first, second):
        assert watch.socket_path is not None
        assert _run_record(watch.socket_path)["run_dir"] == str(watch.run_dir)
        assert watch.tcp_address is not None  # its token file is its own too
    lines = [line for line in capsys.readouterr().err.splitlines() if "watch it with" in line]
    assert lines[0].endswith("watch it with: tuiwatch attach twin")
    assert lines[1].endswith(f"watch it with: tuiwatch attach {second.socket_path}")  # the name would ask which
    found = resolve_target(str(second.socket_path), socket_dir)
    assert isinstance(found, LiveRun)
    assert found.socket == str(second.socket_path)
    second.close()
    assert first.socket_path is not None
    assert first.socket_path.exists()
    assert _run_record(first.socket_path)["run_dir"] == str(first.run_dir)
    first.close()
    assert list(socket_dir.iterdir()) == []


def test_a_name_at_the_length_limit_shared_by_two_runs_gets_two_sockets(run_root: Path, socket_dir: Path):
    name = "n" * 80  # cut to 64 characters in a file name: the "-2" must fit within them, not be cut off
    watches = [tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name=name, system=False, quiet=True) for _ in "ab"]
    paths = [w.socket_path for w in watches]
    assert None not in paths
    assert len(set(paths)) == 2
    for watch in watches:
        assert watch.socket_path is not None
        assert _run_record(watch.socket_path)["run_dir"] == str(watch.run_dir)
        watch.close()


async def test_the_picker_tells_two_runs_of_one_name_and_pid_apart_by_their_directories(
    run_root: Path, socket_dir: Path
):
    watches = [tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name="twin", system=False, quiet=True) for _ in "ab"]
    try:
        runs = list_live_runs(socket_dir)
        assert sorted(r.ledger or "" for r in runs) == sorted(str(w.ledger_path) for w in watches)
        app = RunPicker(runs)
        async with app.run_test(size=(120, 20)) as pilot:
            await pilot.pause()
            options = app.query_one("OptionList")
            prompts = [str(options.get_option_at_index(i).prompt) for i in range(2)]  # type: ignore[attr-defined]
            for watch in watches:
                assert watch.run_dir is not None
                assert sum(p.rstrip().endswith(f" {watch.run_dir.name}") for p in prompts) == 1
            await pilot.press("escape")
    finally:
        for watch in watches:
            watch.close()


def test_a_viewer_whose_run_ends_follows_the_next_run_of_the_name_not_the_one_already_beside_it(
    run_root: Path, socket_dir: Path
):
    # Written after a viewer on the first of two same-named Watches of one process slid onto the second when the
    # first ended: "a run of the same name came back" was any live run of the name, the sibling included.
    first, sibling = (
        tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name="twin", system=False, quiet=True) for _ in "ab"
    )
    messages: list[object] = []
    looked_after_end: list[Path | None] = []

    def ended() -> bool:
        return any(isinstance(m, SourceDisconnected) for m in messages)

    def run_dirs() -> list[object]:
        records = (r for m in messages if isinstance(m, RecordsReceived) for r in m.records)
        return [r["run_dir"] for r in records if r["kind"] == "run"]

    def find(name: str, skip: Collection[SocketId]) -> Path | None:
        found = find_socket_by_name(name, skip, socket_dir)
        if ended():
            looked_after_end.append(found)
        return found

    assert first.socket_path is not None
    source = SocketSource(first.socket_path, "twin", find)
    source.start(messages.append)
    try:
        wait_until(lambda: run_dirs() == [str(first.run_dir)], what="the first run's record")
        first.close()
        wait_until(ended, what="the viewer to see the first run end")
        wait_until(lambda: looked_after_end, what="a look for a run of the name")
        assert looked_after_end[0] is None  # the sibling is live, and not taken
        after = tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name="twin", system=False, quiet=True)
        wait_until(lambda: len(run_dirs()) == 2, what="the viewer on the next run of the name")
        assert run_dirs() == [str(first.run_dir), str(after.run_dir)]
        after.close()
    finally:
        source.stop()
        sibling.close()
