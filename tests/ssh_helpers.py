"""A real sshd on 127.0.0.1 for the SSH tests: a throwaway host key and user key, nothing beyond loopback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from .helpers import wait_until

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass
class Sshd:
    host: str
    ssh: str  # the ssh command that reaches it with the throwaway key
    remote_tuiwatch: str  # tuiwatch on "the remote host" (this one), seeing the test's socket directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TwoHosts:
    ssh: str  # reaches h1 and h2 (an ssh config of the test's)
    remote_tuiwatch: str
    socket_dirs: list[Path]  # h1's and h2's


def start_sshd(d: Path, extra_config: str = "") -> tuple[subprocess.Popen[str], int, Path]:
    """A real sshd on 127.0.0.1 with a throwaway host key and user key in ``d``: the process, its port and the
    user key. Skips the test where sshd or root is missing."""
    if not os.path.exists(SSHD) or os.geteuid() != 0:
        pytest.skip("needs sshd and root: make check installs openssh-server where it can")
    d.mkdir(mode=0o700)
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    # The port is free when asked for and taken by sshd a moment later: another worker of the suite can take it in
    # between, and then sshd exits on its bind. A new port then, a few times.
    for attempt in range(3):
        port = free_port()
        config = d / "sshd_config"
        config.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nPidFile {d / 'sshd.pid'}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
            "LogLevel ERROR\n" + extra_config
        )
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE, text=True)
        if _listens(proc, port, last=attempt == 2):
            return proc, port, d / "user_key"
    raise AssertionError("unreachable")


def _listens(proc: subprocess.Popen[str], port: int, *, last: bool) -> bool:
    """Wait for sshd to listen on ``port``; False where it exited because the port was taken (unless ``last``)."""
    exited: list[str] = []

    def listening() -> bool:
        if proc.poll() is not None:
            exited.append(proc.stderr.read() if proc.stderr else "")
            return True
        with socket.socket() as s:
            s.settimeout(5)
            # sshd's banner, not another process's listener on the port taken in between
            return s.connect_ex(("127.0.0.1", port)) == 0 and _banner(s).startswith(b"SSH-")

    wait_until(listening, what="sshd to listen")
    if not exited:
        return True
    if last or "Address already in use" not in exited[0]:
        raise AssertionError(f"sshd exited: {exited[0]}")
    return False


def _banner(s: socket.socket) -> bytes:
    try:
        return s.recv(64)
    except OSError:  # (a listener that says nothing)
        return b""


def ssh_command(port: int, key: Path) -> str:
    return (
        f"ssh -p {port} -i {key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o BatchMode=yes -o LogLevel=ERROR"
    )
