"""A real sshd on 127.0.0.1 for the SSH tests: a throwaway host key and user key, nothing beyond loopback."""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass

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
