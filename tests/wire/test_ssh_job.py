"""One job on two "hosts": a two-node torchrun on loopback, each node's rank behind an sshd of its own, one
viewer over both (one ssh per host), a command at one step on both, and a host that goes silent shown stale
while the viewer stays responsive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuiwatch.cli.attach import job_source
from tuiwatch.ledger.ranks import rank_ledgers
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.viewer.panes.ranks import RanksPane
from tuiwatch.wire.discovery import parse_remote

from ..helpers import SCRIPTS, env_for, kill_tree, wait_until
from ..ssh_helpers import TwoHosts, free_port
from ..viewer_helpers import RecordingApp, drawn, plain, ranks_stepping, until

pytestmark = pytest.mark.integration


def start_node(node: int, port: int, run_dir: Path, socket_dir: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"]
    cmd += [f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}", "--rdzv_id=twohosts"]
    cmd += [str(SCRIPTS / "ddp_train.py"), "--run-dir", str(run_dir), "--epochs", "1000", "--step-sleep", "0.01"]
    with open(run_dir.parent / f"node{node}.log", "w") as log:  # the child keeps its own copy of the fd
        return subprocess.Popen(cmd, env=env_for(socket_dir), stdout=log, stderr=subprocess.STDOUT, text=True)


def all_listening(socket_dirs: list[Path]) -> bool:
    return all(list(d.glob("*.sock")) for d in socket_dirs)


def relay_of(socket_dir: Path) -> int | None:
    """The pid of the `tuiwatch relay` sshd started for the host whose socket directory this is."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"relay" in argv and f"TUIWATCH_DIR={socket_dir}".encode() in env:
            return int(entry.name)
    return None


async def test_one_job_on_two_hosts_is_one_view_and_a_silent_host_shows_stale(tmp_path: Path, two_hosts: TwoHosts):
    port = free_port()
    nodes = [start_node(i, port, tmp_path / f"runs{i}", two_hosts.socket_dirs[i]) for i in (0, 1)]
    try:
        wait_until(lambda: all_listening(two_hosts.socket_dirs), timeout=60, what="each host's rank listening")
        remotes = [parse_remote(f"h{i}:ddp", two_hosts.ssh, two_hosts.remote_tuiwatch) for i in (1, 2)]
        source = job_source([r for r in remotes if r is not None])
        assert source.ranks == [0, 1]
        assert [relay.host for relay in source.relays] == ["h1", "h2"]
        app = RecordingApp(source)
        async with app.run_test(size=(200, 40)) as pilot:
            ranks = await ranks_stepping(pilot, app)
            await drawn(pilot)
            rows = plain(app.query_one(RanksPane)).splitlines()
            assert [row.split()[:2] for row in rows[1:3]] == [["0", "live"], ["1", "live"]]

            await pilot.press("c")
            await until(pilot, lambda: any("checkpoint written" in n for n in app.notes), 60, "the checkpoints")
            assert next(n for n in app.notes if "checkpoint written" in n).startswith("2 ranks after step ")

            # h2 goes silent: its relay stops (as a hung host or a dead link would), nothing closes.
            relay = wait_until(lambda: relay_of(two_hosts.socket_dirs[1]), what="h2's relay")
            os.kill(relay, signal.SIGSTOP)
            await until(pilot, lambda: ranks.ranks[1].status(time.time()) == "stale", 30, "rank 1 stale")
            step0 = ranks.ranks[0].step or 0
            await until(pilot, lambda: (ranks.ranks[0].step or 0) > step0 + 5, 30, "h1's records still coming")
            await pilot.press("w")  # the viewer still answers keys at once
            await until(pilot, lambda: any(n.startswith("charts: ") for n in app.notes), 15, "the key's answer")
            await drawn(pilot)
            rows = plain(app.query_one(RanksPane)).splitlines()
            assert rows[2].split()[:2] == ["1", "stale"]
            os.kill(relay, signal.SIGKILL)
            await until(pilot, lambda: ranks.ranks[1].status(time.time()) == "gone", 30, "rank 1 gone with its link")
    finally:
        for node in nodes:
            kill_tree(node)
    checkpoints = {}
    for i in (0, 1):
        (job,) = (tmp_path / f"runs{i}").iterdir()
        assert job.name == "ddp-twohosts"  # torchrun's --rdzv_id: the run id both hosts share
        ledgers = rank_ledgers(job)
        assert list(ledgers) == [i]
        checkpoints[i] = next(r for r in read_ledger(ledgers[i]) if r["kind"] == "action")
    assert checkpoints[0]["step"] == checkpoints[1]["step"]
    assert checkpoints[0]["action"] == checkpoints[1]["action"] == "checkpoint"
