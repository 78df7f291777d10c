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
    port = free_port()
    config = d / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "StrictModes no\nPermitRootLogin prohibit-password\nLogLevel ERROR\n" + extra_config
    )
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE, text=True)

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"sshd exited: {proc.stderr.read() if proc.stderr else ''}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, what="sshd to listen")
    return proc, port, d / "user_key"


def ssh_command(port: int, key: Path) -> str:
    return (
        f"ssh -p {port} -i {key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o BatchMode=yes -o LogLevel=ERROR"
    )
