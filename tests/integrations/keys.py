"""``c`` then ``s`` sent to a training process as a viewer sends them, for the integrations' tests."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuiwatch.wire.protocol import command_line, connect, iter_records
from tuiwatch.wire.socketdir import list_sockets

from ..helpers import STARTED, env_for, wait_until


@dataclass
class Stopped:
    saved: dict[str, Any]  # the checkpoint command's reply
    stopped: dict[str, Any]  # the stop command's reply
    returncode: int
    out: str
    err: str


def checkpoint_then_stop(cmd: list[str], socket_dir: Path, after_step: int = 3) -> Stopped:
    """Start ``cmd``; once its ledger passed ``after_step``, send ``checkpoint`` and then ``stop``; let it end."""
    proc = subprocess.Popen(cmd, env=env_for(socket_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    STARTED.append(proc)
    path = wait_until(lambda: next(iter(list_sockets(socket_dir)), None), 120, "the run's socket").path
    sock = connect(path, timeout=60)
    stream = iter_records(sock)
    next(r for r in stream if r.get("kind") == "step" and r["step"] >= after_step)
    sock.sendall(command_line("checkpoint", 1))
    saved = _reply(stream, 1)
    sock.sendall(command_line("stop", 2))
    stopped = _reply(stream, 2)
    sock.close()
    out, err = proc.communicate(timeout=120)
    return Stopped(saved, stopped, proc.returncode, out, err)


def _reply(stream: Any, cmd_id: int) -> dict[str, Any]:
    for record in stream:
        if record.get("kind") == "action" and record.get("id") == cmd_id:
            return record  # type: ignore[no-any-return]
    raise AssertionError(f"the run closed the connection before replying to command {cmd_id}")
