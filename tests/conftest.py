from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import STARTED, wait_until
from .ssh_helpers import SSHD, Sshd, free_port


@pytest.fixture(autouse=True)
def no_training_left_behind() -> Iterator[None]:
    """A test that fails midway must not leave a (possibly paused) training process running."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def socket_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private socket directory for this test, also used by in-process Watches.

    Short path: a Unix socket path must fit in 108 bytes.
    """
    path = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))
    os.chmod(path, 0o700)
    monkeypatch.setenv("TUIWATCH_DIR", str(path))
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def tmux(socket_dir: Path) -> Iterator[list[str]]:
    """A tmux server of the test's own (its own name: the last test's server may still be shutting down)."""
    server = ["tmux", "-L", f"tuiwatch-test-{os.getpid()}-{secrets.token_hex(4)}", "-f", "/dev/null"]
    yield server
    subprocess.run([*server, "kill-server"], capture_output=True)


@pytest.fixture
def sshd(tmp_path: Path, socket_dir: Path) -> Iterator[Sshd]:
    """A real sshd on 127.0.0.1 with a throwaway host key and user key."""
    if not os.path.exists(SSHD) or os.geteuid() != 0:
        pytest.skip("needs sshd and root: make check installs openssh-server where it can")
    d = tmp_path / "ssh"
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
        "StrictModes no\nPermitRootLogin prohibit-password\nLogLevel ERROR\n"
    )
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE, text=True)

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"sshd exited: {proc.stderr.read() if proc.stderr else ''}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, what="sshd to listen")
    ssh = (
        f"ssh -p {port} -i {d / 'user_key'} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o BatchMode=yes -o LogLevel=ERROR"
    )
    yield Sshd("127.0.0.1", ssh, f"env TUIWATCH_DIR={socket_dir} {sys.executable} -m tuiwatch")
    proc.terminate()
    proc.wait(10)
