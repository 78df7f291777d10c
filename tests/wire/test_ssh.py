"""Attach and ls through a real ssh to a real sshd on loopback."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from torch import nn

import tuiwatch
from tuiwatch.cli.attach import job_source
from tuiwatch.viewer.sources import CommandSource
from tuiwatch.wire.discovery import choose_remote_run, parse_remote

from ..helpers import env_for, finish, start_training, wait_until
from ..ssh_helpers import Sshd
from ..tmux_helpers import HEADER, capture
from ..viewer_helpers import RecordingApp, until

pytestmark = pytest.mark.integration  # a real sshd on loopback


def tw(socket_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuiwatch", *args], env=env_for(socket_dir), capture_output=True, text=True, timeout=120
    )


def test_ls_host_lists_the_runs_there(sshd: Sshd, run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--name", "resnet", "--steps", "2000", "--step-sleep", "0.005")
    wait_until(lambda: list(socket_dir.glob("*.sock")) or None, what="the run's socket")
    out = tw(socket_dir, "ls", f"{sshd.host}:", "--json", "--ssh", sshd.ssh, "--remote-tuiwatch", sshd.remote_tuiwatch)
    assert out.returncode == 0, out.stderr
    assert [(r["name"], r["pid"]) for r in json.loads(out.stdout)] == [("resnet", proc.pid)]
    proc.kill()
    proc.wait()


async def test_attach_host_name_streams_the_run_and_carries_commands(sshd: Sshd, run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--name", "resnet", "--steps", "100000", "--step-sleep", "0.005")
    wait_until(lambda: list(socket_dir.glob("*.sock")) or None, what="the run's socket")
    remote = parse_remote(f"{sshd.host}:resnet", sshd.ssh, sshd.remote_tuiwatch)
    assert remote is not None
    chosen = choose_remote_run(remote)
    app = RecordingApp(CommandSource(remote.argv("relay", str(chosen.pid)), f"{remote.host}:{chosen.name}"))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.state.status == "live" and (app.state.step or 0) > 10, what="live steps")
        assert app.state.run["pid"] == proc.pid
        await pilot.press("s")
        await pilot.press("y")
        await until(pilot, lambda: app.state.status == "stopped", what="the run to stop through ssh")
    finish(proc)


def test_a_wrong_host_or_a_missing_tuiwatch_is_one_clear_line(sshd: Sshd, socket_dir: Path):
    out = tw(socket_dir, "attach", "no-such-host.invalid:x", "--ssh", "ssh -o BatchMode=yes -o ConnectTimeout=5")
    assert out.returncode == 1
    assert out.stderr.startswith("tuiwatch: error: ssh to no-such-host.invalid failed: ")
    assert out.stderr.count("\n") == 1
    out = tw(socket_dir, "ls", f"{sshd.host}:", "--ssh", sshd.ssh, "--remote-tuiwatch", "/nonexistent/tuiwatch")
    assert out.returncode == 1
    assert out.stderr == (
        f"tuiwatch: error: tuiwatch is not installed on {sshd.host} (ran: /nonexistent/tuiwatch): "
        "install it there, or give --remote-tuiwatch PATH\n"
    )
    out = tw(socket_dir, "attach", f"{sshd.host}:nothing", "--ssh", sshd.ssh, "--remote-tuiwatch", sshd.remote_tuiwatch)
    assert out.returncode == 1
    assert out.stderr == f"tuiwatch: error: no live runs on {sshd.host}\n"


def test_attach_host_name_in_a_real_terminal(sshd: Sshd, run_root: Path, socket_dir: Path, tmux: list[str]):
    proc = start_training(run_root, socket_dir, "--name", "resnet", "--steps", "100000", "--step-sleep", "0.01")
    wait_until(lambda: list(socket_dir.glob("*.sock")) or None, what="the run's socket")
    attach = shlex.join(
        [
            sys.executable,
            "-m",
            "tuiwatch",
            "attach",
            f"{sshd.host}:resnet",
            "--ssh",
            sshd.ssh,
            "--remote-tuiwatch",
            sshd.remote_tuiwatch,
        ]
    )
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "e2e", "-x", "160", "-y", "40", f"env TERM=xterm-256color {attach}"],
        check=True,
    )
    first = wait_until(lambda: HEADER.search(capture(tmux, "e2e")), timeout=30, what="the viewer over ssh")
    assert first.group(1) == "resnet"
    step = int(first.group(2).replace(",", ""))
    wait_until(
        lambda: (m := HEADER.search(capture(tmux, "e2e"))) and int(m.group(2).replace(",", "")) > step + 5,
        what="the step to advance on screen",
    )
    subprocess.run([*tmux, "send-keys", "-t", "e2e", "q"], check=True)
    proc.kill()
    proc.wait()


def test_a_target_that_is_an_ssh_option_is_refused_before_ssh_runs(socket_dir: Path, tmp_path: Path):
    planted = tmp_path / "pwned"
    out = tw(socket_dir, "attach", f"-oProxyCommand=touch {planted}:run", "--ssh", "ssh")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"tuiwatch: error: '-oProxyCommand=touch {planted}' is not a host: a host name cannot start with '-' "
        "(an ssh option?)"
    )
    assert not planted.exists()
    remote = parse_remote("gpu-box:run", "ssh -p 2222")
    assert remote is not None
    assert remote.argv("relay", "7")[:5] == ["ssh", "-p", "2222", "-T", "--"]  # the host is never read as an option


def test_two_runs_of_one_name_in_one_process_on_a_host_are_told_apart_by_their_sockets(
    sshd: Sshd, run_root: Path, socket_dir: Path
):
    watches = [tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name="twin", system=False, quiet=True) for _ in "ab"]
    try:
        out = tw(
            socket_dir, "attach", f"{sshd.host}:twin", "--ssh", sshd.ssh, "--remote-tuiwatch", sshd.remote_tuiwatch
        )
        assert out.returncode == 1
        sockets = [f"{sshd.host}:{w.socket_path}" for w in watches]
        listed = out.stderr.removeprefix(f"tuiwatch: error: 2 live runs named 'twin' on {sshd.host}: attach ")
        assert sorted(listed.rstrip("\n").split(" or ")) == sorted(sockets)
        other = tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name="other", system=False, quiet=True)
        watches.append(other)
        out = tw(socket_dir, "attach", f"{sshd.host}:", "--ssh", sshd.ssh, "--remote-tuiwatch", sshd.remote_tuiwatch)
        assert out.returncode == 1
        # With no name, each run is named by what names it alone: the name where it is the only one of it.
        listed = out.stderr.removeprefix(f"tuiwatch: error: 3 live runs on {sshd.host}: attach ").rstrip("\n")
        assert sorted(listed.split(" or ")) == sorted([*sockets, f"{sshd.host}:other"])
        later = watches[1]
        remote = parse_remote(f"{sshd.host}:{later.socket_path}", sshd.ssh, sshd.remote_tuiwatch)
        assert remote is not None
        chosen = choose_remote_run(remote)
        assert chosen.socket == str(later.socket_path)
        # What attach then runs there: the relay of that socket, not of the pid the two runs share.
        relay = subprocess.Popen(
            remote.argv("relay", chosen.socket), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env_for(socket_dir)
        )
        assert relay.stdout is not None
        first = json.loads(relay.stdout.readline())
        assert (first["kind"], first["run_dir"]) == ("run", str(later.run_dir))
        relay.kill()
        relay.wait()
    finally:
        for watch in watches:
            watch.close()


def test_attach_host_alone_takes_the_one_job_there_as_one_run(
    sshd: Sshd, run_root: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # Its two ranks used to count as two runs, and "attach HOST:" was refused ("2 live runs ... attach HOST:NAME").
    watches = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        watches.append(
            tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name="ddp", run_id="job-7", system=False, quiet=True)
        )
    try:
        remote = parse_remote(f"{sshd.host}:", sshd.ssh, sshd.remote_tuiwatch)
        assert remote is not None
        chosen = choose_remote_run(remote)
        assert (chosen.name, chosen.run_id, chosen.rank, chosen.world_size) == ("ddp", "job-7", 0, 2)
        source = job_source([replace(remote, name=chosen.run_id)])  # what attach then does
        assert source.ranks == [0, 1]
    finally:
        for watch in watches:
            watch.close()
