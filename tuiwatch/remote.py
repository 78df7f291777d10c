"""Reaching runs on another host through the user's own ssh: ``ssh -T host tuiwatch relay NAME``. Pure glue, no torch.

Nothing listens on the network: ssh carries the wire protocol over its own
channel, with the user's keys, ``~/.ssh/config`` and jump hosts.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass

import orjson

from tuiwatch.errors import TuiwatchError
from tuiwatch.runs import LiveRun

DEFAULT_SSH = "ssh"
DEFAULT_REMOTE = "tuiwatch"
LIST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Remote:
    host: str  # [user@]host, as ssh takes it
    name: str | None  # the run; None: the only one, or ask
    ssh: str = DEFAULT_SSH  # the ssh command, split like a shell would: "ssh -p 2222 -i key"
    tuiwatch: str = DEFAULT_REMOTE  # the remote command: "~/venv/bin/tuiwatch", "python -m tuiwatch"

    def argv(self, *args: str) -> list[str]:
        # ssh joins the remote words with spaces for the remote shell: quote them as one string.
        return [*shlex.split(self.ssh), "-T", self.host, shlex.join([*shlex.split(self.tuiwatch), *args])]


def parse_remote(target: str | None, ssh: str | None = None, tuiwatch: str | None = None) -> Remote | None:
    """``[user@]host:[name]`` as a :class:`Remote`; None for a local target (name, pid, socket path)."""
    if not target or ":" not in target:
        return None
    host, _, name = target.partition(":")
    if not host or "/" in host:
        return None  # a path with a colon in it
    return Remote(host, name or None, ssh or os.environ.get("TUIWATCH_SSH") or DEFAULT_SSH,
                  tuiwatch or os.environ.get("TUIWATCH_REMOTE") or DEFAULT_REMOTE)  # fmt: skip


def list_remote_runs(remote: Remote) -> list[LiveRun]:
    """``tuiwatch ls --json`` on the remote host; a one-line TuiwatchError saying what failed."""
    argv = remote.argv("ls", "--json")
    try:
        done = subprocess.run(argv, capture_output=True, timeout=LIST_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise TuiwatchError(f"cannot run {argv[0]!r}: install OpenSSH or give --ssh") from None
    except subprocess.TimeoutExpired:
        raise TuiwatchError(f"ssh to {remote.host} did not answer in {LIST_TIMEOUT_S:.0f} s") from None
    err = done.stderr.decode(errors="replace").strip().splitlines()
    last = err[-1] if err else f"exit code {done.returncode}"
    if done.returncode == 255:
        raise TuiwatchError(f"ssh to {remote.host} failed: {last}")
    if done.returncode == 127 or "command not found" in last or "No module named" in last:
        raise TuiwatchError(f"tuiwatch is not installed on {remote.host} (ran: {remote.tuiwatch}): "
                            "install it there, or give --remote-tuiwatch PATH")  # fmt: skip
    if done.returncode != 0:
        raise TuiwatchError(f"tuiwatch ls on {remote.host} failed: {last}")
    try:
        rows = orjson.loads(done.stdout)
        return [LiveRun(str(r["name"]), int(r["pid"]), str(r["socket"]), r.get("step"), str(r.get("status", "?")),
                        r.get("run_id"), r.get("ledger")) for r in rows]  # fmt: skip
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise TuiwatchError(f"tuiwatch ls on {remote.host} did not answer with a run list") from None


def choose_remote_run(remote: Remote) -> LiveRun:
    """The run ``remote`` names, checked against the host's live runs (one ssh round trip)."""
    runs = list_remote_runs(remote)
    if not runs:
        raise TuiwatchError(f"no live runs on {remote.host}")
    names = ", ".join(f"{r.name} (pid {r.pid})" for r in runs)
    if remote.name is None:
        if len(runs) > 1:
            raise TuiwatchError(f"{len(runs)} live runs on {remote.host}: {names}; attach {remote.host}:NAME")
        return runs[0]
    matches = [r for r in runs if remote.name in (r.name, str(r.pid))]
    if not matches:
        raise TuiwatchError(f"no live run named {remote.name!r} on {remote.host}; live runs: {names}")
    return matches[0]
